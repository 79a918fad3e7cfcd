"""The manual's code that is meant to run, run: the README's quick-start pack through the agent
API (a run, then its feedback, as the README's curl lines do), every `<!-- example: path -->`
block equal to the file the tests run, the TOML and settings the pages show, the CLI commands
they list."""

from __future__ import annotations

import re
import shlex
import sys
import tomllib

import pytest
from typer.testing import CliRunner

from agents.packs import Pack, get_pack
from deploy.cli import app
from deploy.settings import AgentApiSettings
from tests.docs.markdown import DOCS, ROOT, blocks, pages
from tests.fakes.scripted_llm import Reply

QUICK_START = "README quick start"


def every_block():
    return [b for page, text in pages().items() for b in blocks(page, text)]


def readme_quick_start() -> str:
    [block] = [b for b in every_block() if b.mark and b.mark.startswith(QUICK_START)]
    assert block.page == "README.md" and block.lang == "python"
    return block.code


def test_the_readme_example_is_about_ten_lines():
    code = [line for line in readme_quick_start().splitlines() if line.strip()]
    assert len(code) <= 14, code


@pytest.fixture
def my_pack(tmp_path, monkeypatch):
    """The README's `my_pack.py`, on the path as the README says."""
    (tmp_path / "my_pack.py").write_text(readme_quick_start())
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "my_pack:pack"
    sys.modules.pop("my_pack", None)


def test_the_readme_pack_serves_a_run_and_takes_its_feedback(my_pack, start_api, llm):
    pack = get_pack(my_pack)
    assert isinstance(pack, Pack) and [a.name for a in pack.agents] == ["helper"]
    llm.push(
        Reply(tool_calls=[("calculator", '{"expression": "17 * 23"}')]),
        Reply(content="17 times 23 is 391."),
    )
    api = start_api(specs=None, packs=[my_pack])
    assert [a["name"] for a in api.http.get("/v1/agents").json()["agents"]] == ["helper"]
    r = api.run("What is 17 times 23?", agent="helper")
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["output"] == "17 times 23 is 391." and body["tools"] == ["calculator"]
    assert llm.requests[1]["messages"][-1]["content"].startswith("391")  # the tool really ran
    feedback = api.feedback(
        trajectory_id=body["trajectory_id"],
        feedback_token=body["feedback_token"],
        user_id="u1",
        kind="thumbs",
        value=1,
    )
    assert feedback.status_code == 202, feedback.text


def test_every_marked_example_is_the_file_the_tests_run():
    marked = [b for b in every_block() if b.mark and not b.mark.startswith(QUICK_START)]
    assert marked, "no page shows a tested example file"
    for block in marked:
        path = ROOT / block.mark
        assert path.exists(), f"{block.page}: the example {block.mark} is gone"
        assert block.code == path.read_text(), f"{block.page}: differs from {block.mark}"


def test_every_python_block_is_run_or_marked():
    """A Python block is either a tested file's text or the quick start: none goes stale."""
    loose = [b.page for b in every_block() if b.lang == "python" and not b.mark]
    assert loose == [], f"Python blocks with no test behind them: {loose}"


def test_the_toml_blocks_parse():
    tomls = [b for b in every_block() if b.lang == "toml"]
    assert tomls
    for block in tomls:
        tomllib.loads(block.code)


def test_the_settings_the_models_page_shows_load(monkeypatch):
    """`ARLOOP_AGENT_MODELS` and `ARLOOP_POLICY_FALLBACKS` as the page writes them."""
    [block] = [
        b for b in blocks("docs/models.md", (DOCS / "models.md").read_text()) if b.lang == "bash"
    ]
    assigned = dict(re.findall(r"^(ARLOOP_\w+)='(.*?)'$", block.code, re.DOTALL | re.MULTILINE))
    assert set(assigned) == {"ARLOOP_AGENT_MODELS", "ARLOOP_POLICY_FALLBACKS"}
    for name, value in assigned.items():
        monkeypatch.setenv(name, value)
    settings = AgentApiSettings(_env_file=None)
    assert settings.agent_models["triage"].model == "anthropic/claude-3-5-haiku-latest"
    assert settings.policy_fallbacks[0].model == "openai/gpt-4o-mini"


def test_every_command_the_running_page_lists_exists():
    [block] = [b for b in blocks("docs/running.md", (DOCS / "running.md").read_text())][:1]
    commands = []
    for line in block.code.splitlines():
        words = shlex.split(line.split("#")[0].replace("|", " | "))
        if words[:1] != [".venv/bin/arloop"] or words[1].startswith("-"):
            continue
        command = []
        for word in words[1:]:
            if not re.fullmatch(r"[a-z][a-z-]*", word):
                break
            command.append(word)
        commands.append(command)
    assert len(commands) >= 10, commands
    runner = CliRunner()
    for command in commands:
        result = runner.invoke(app, [*command, "--help"])
        assert result.exit_code == 0, (command, result.output)
