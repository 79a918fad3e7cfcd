"""Packs from a team's own code: `module:attr`, the `arloop.packs` entry points, the manual's
FAQ example (docs/packs.md: the same text as the file it runs), errors that name the fix,
`arloop packs list`."""

from __future__ import annotations

import json
import re
import sys
import tomllib
from pathlib import Path

import pytest
from typer.testing import CliRunner

from agents.packs import Pack, PackNotFound, get_pack, load_packs, registered
from agents.packs.loading import BUILTIN, GROUP
from agents.runtime import AgentSpec
from deploy.cli import app
from tests.fakes.scripted_llm import Reply

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "tests" / "agents" / "faq_example" / "faq_pack.py"
FAQ = "tests.agents.faq_example.faq_pack:pack"
MARK = "<!-- example: tests/agents/faq_example/faq_pack.py -->"

# A module with a bit of everything that is not a pack, for the error cases.
NOT_PACKS = """
from agents.packs import Pack
from agents.runtime import AgentSpec

SYSTEM = "not a pack"
EMPTY = Pack("empty", ())
WRONG = Pack("wrong", ("faq",))
AGENT = AgentSpec(name="faq", description="d", system_prompt="s")
TWIN = Pack("twin", (AgentSpec(name="faq", description="d", system_prompt="s"),))
NAMELESS = Pack("", (AGENT,))
LISTED = Pack("listed", (AGENT,), tasks=["What are your hours?"])
UNREAD = Pack("unread", (AGENT,), answer_of="final_number")

def broken():
    raise RuntimeError("no database")

def sized(tutoring_eval_size):
    return Pack(f"sized{tutoring_eval_size}", (AGENT,))
"""


def docs_example() -> str:
    text = (ROOT / "docs" / "packs.md").read_text()
    assert MARK in text, "docs/packs.md lost the example's marker"
    block = text.split(MARK, 1)[1]
    match = re.match(r"\s*```python\n(.*?)```\n", block, re.DOTALL)
    assert match, "the marker is not followed by a ```python block"
    return match.group(1)


def test_the_docs_example_is_the_tested_file_and_under_60_lines():
    code = EXAMPLE.read_text()
    assert docs_example() == code
    assert len(code.splitlines()) < 60


def test_the_faq_example_answers_a_request_through_the_agent_api(start_api, llm):
    llm.push(
        Reply(tool_calls=[("kb_search", '{"query": "reset password"}')]),
        Reply(content="Choose Forgot password on the sign-in page.\nSource: account.md"),
    )
    api = start_api(specs=None, packs=[FAQ])
    assert [a["name"] for a in api.http.get("/v1/agents").json()["agents"]] == ["faq"]
    r = api.run("How do I reset my password?", agent="faq")
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["output"].endswith("Source: account.md") and body["tools"] == ["kb_search"]
    tool_result = llm.requests[1]["messages"][-1]
    assert tool_result["role"] == "tool" and "Forgot password" in tool_result["content"]
    assert "Source: account.md" in tool_result["content"]  # the team's folder was searched
    pack = get_pack(FAQ)
    task = pack.tasks("eval")[0]
    assert pack.has_eval_suite() and pack.verify(task, body["output"]) == 1.0
    assert pack.verify(pack.tasks("eval")[1], body["output"]) == 0.0


def test_the_built_in_packs_load_through_the_entry_points_pyproject_declares():
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["entry-points"]
    assert declared[GROUP] == BUILTIN
    for name, target in BUILTIN.items():
        assert [e.target for e in registered()[name]] == [target]
        assert get_pack(name).name == name
    assert [a.name for a in load_packs(["tutoring", "medical"])] == [
        "tutor",
        "tutor_hints",
        "triage",
    ]


def _distribution(where: Path, name: str, entries: dict[str, str]) -> None:
    """An installed distribution's metadata, as pip writes it, with `arloop.packs` entries."""
    info = where / f"{name}-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n")
    lines = "".join(f"{k} = {v}\n" for k, v in entries.items())
    (info / "entry_points.txt").write_text(f"[{GROUP}]\n{lines}")


def test_a_package_registers_packs_under_the_entry_point_group(tmp_path, monkeypatch):
    _distribution(tmp_path, "myteam_faq", {"faq": FAQ, "tutoring": FAQ})
    monkeypatch.syspath_prepend(str(tmp_path))
    found = registered()
    assert [(e.target, e.source) for e in found["faq"]] == [(FAQ, "myteam_faq 1.0")]
    assert get_pack("faq").name == "faq"
    assert [a.name for a in load_packs(["faq"])] == ["faq"]
    # arloop's own name claimed by a second package (whether or not this checkout's entry
    # points are installed): refused, naming both and the way out
    assert {e.target for e in found["tutoring"]} == {FAQ, BUILTIN["tutoring"]}
    with pytest.raises(PackNotFound, match="registered twice .* name the one you want"):
        get_pack("tutoring")


def test_an_installed_arloop_registers_its_own_packs_without_the_fallback(tmp_path, monkeypatch):
    _distribution(tmp_path, "arloop", BUILTIN)  # what `pip install -e .` writes now
    monkeypatch.syspath_prepend(str(tmp_path))
    for name, target in BUILTIN.items():
        assert [(e.target, e.source) for e in registered()[name]] == [(target, "arloop 1.0")]


@pytest.fixture
def not_packs(tmp_path, monkeypatch):
    (tmp_path / "not_packs.py").write_text(NOT_PACKS)
    (tmp_path / "raises_on_import.py").write_text("raise KeyError('API_TOKEN')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield
    for name in ("not_packs", "raises_on_import"):
        sys.modules.pop(name, None)


@pytest.mark.parametrize(
    ("ref", "says"),
    [
        ("cooking", "unknown agent pack 'cooking': installed packs are medical, tutoring"),
        ("myteam.faq:pack", "cannot import myteam.faq .* put its folder on PYTHONPATH"),
        ("raises_on_import:pack", "importing raises_on_import raised KeyError: 'API_TOKEN'"),
        ("not_packs:nothing", "not_packs has no attribute 'nothing'"),
        ("not_packs:SYSTEM", r"not_packs:SYSTEM is a str, not an agents.packs.Pack \(nor a"),
        ("not_packs:broken", r"calling not_packs:broken\(\) raised RuntimeError: no database"),
        ("not_packs:EMPTY", "has no agents; Pack.agents is a tuple of agents.runtime.AgentSpec"),
        ("not_packs:WRONG", "has a str among its agents"),
        ("not_packs:NAMELESS", "has name '': give Pack.name a non-empty str"),
        ("not_packs:LISTED", r"a list as Pack.tasks: give it a function, tasks\(split\)"),
        ("not_packs:UNREAD", r"a str as Pack.answer_of: give it a function, answer_of\(reply\)"),
        ("not_packs:", "is not 'module:attr'"),
    ],
)
def test_a_reference_that_is_not_a_pack_is_refused_naming_it_and_the_fix(not_packs, ref, says):
    with pytest.raises(PackNotFound, match=says) as err:
        get_pack(ref)
    assert repr(ref) in str(err.value)


def test_options_reach_a_pack_function_by_name_and_agent_names_stay_unique(not_packs):
    assert get_pack("not_packs:sized", tutoring_eval_size=7).name == "sized7"
    with pytest.raises(PackNotFound, match="agent 'faq' is served by both .* rename one"):
        load_packs([FAQ, "not_packs:TWIN"])


def test_a_pack_without_tasks_is_served_but_has_no_eval_suite():
    bare = Pack("bare", (AgentSpec(name="a", description="d", system_prompt="s"),))
    assert bare.tasks("eval") == [] and not bare.has_eval_suite()
    assert get_pack("medical").has_eval_suite()


def test_packs_list_shows_sources_agents_and_eval_suites(not_packs):
    runner = CliRunner()
    env = {"ARLOOP_PACKS": json.dumps(["tutoring", FAQ]), "COLUMNS": "250"}
    ok = runner.invoke(app, ["packs", "list"], env=env)
    assert ok.exit_code == 0, ok.output
    rows = {
        line.split("│")[1].strip(): [c.strip() for c in line.split("│")[2:-1]]
        for line in ok.output.splitlines()
        if line.count("│") == 6
    }
    assert rows["tutoring"][:2] == ["tutor, tutor_hints", "yes"]
    assert rows["medical"][:2] == ["triage", "yes"]
    assert rows["faq"] == ["faq", "yes", "module:attr", FAQ]
    bad = runner.invoke(app, ["packs", "list", "not_packs:SYSTEM"], env=env)
    assert bad.exit_code == 1
    assert "not_packs:SYSTEM is a str, not an agents.packs.Pack" in bad.output
