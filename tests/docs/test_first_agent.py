"""docs/first_agent.md, run: its pack (`tests/docs/first_agent/shop_pack.py`, the page's marked
block) served through the agent API, the run its curl line sends, every feedback body it shows,
and the small-model settings it gives on a real policy server with the tiny model, each 502 it
quotes coming back, word for word, when its setting is left out (and refusing the agent API's
start with that message)."""

from __future__ import annotations

import json
import re
import sys

import pytest

from agents.pack_fit import check_fit
from agents.packs import agents_of, get_pack
from deploy.embedded_redis import free_port
from deploy.policy_server.settings import PolicyServerSettings
from deploy.settings import AgentApiSettings
from tests.deploy.policy_server.support import running_server
from tests.docs.markdown import DOCS, ROOT, blocks
from tests.fakes.scripted_llm import Reply

PAGE = DOCS / "first_agent.md"
FOLDER = ROOT / "tests" / "docs" / "first_agent"
FEEDBACK_KINDS = ["correction", "outcome", "rating", "score", "thumbs"]


def page_blocks(lang: str) -> list[str]:
    return [b.code for b in blocks("docs/first_agent.md", PAGE.read_text()) if b.lang == lang]


def served_packs() -> list[str]:
    """`ARLOOP_PACKS` as the page's serve block sets it."""
    [packs] = re.findall(r"ARLOOP_PACKS='(.+?)'", page_blocks("bash")[0])
    return json.loads(packs)


def run_request() -> tuple[str, dict]:
    """(agent, body) of the page's curl line."""
    [curl] = [b for b in page_blocks("bash") if "/runs" in b]
    agent = re.search(r"/v1/agents/(\w+)/runs", curl).group(1)
    return agent, json.loads(re.search(r"-d '(.+?)'", curl).group(1))


def small_model_env() -> dict[str, str]:
    """The `export ARLOOP_...=...` lines of the page's small-model block."""
    return dict(re.findall(r"^export (ARLOOP_\w+)=(\S+)", page_blocks("bash")[-1], re.MULTILINE))


def quoted_502s() -> list[str]:
    """The messages the small-model table quotes, in its order."""
    return re.findall(r"^\| `(.+?)` \|", PAGE.read_text(), re.MULTILINE)


@pytest.fixture
def shop_pack(monkeypatch):
    """The page's `shop_pack.py` on the path, as its serve block puts it there."""
    monkeypatch.syspath_prepend(str(FOLDER))
    yield
    sys.modules.pop("shop_pack", None)


def test_the_pack_answers_with_its_tool_and_takes_every_feedback_body_the_page_shows(
    shop_pack, start_api, llm
):
    llm.push(
        Reply(tool_calls=[("delivery_days", '{"country": "France"}')]),
        Reply(content="A parcel takes 2 days to France."),
    )
    api = start_api(specs=None, packs=served_packs())
    agent, request = run_request()
    r = api.http.post(f"/v1/agents/{agent}/runs", json=request)
    assert r.status_code == 200, r.text
    run = r.json()
    assert run["tools"] == ["delivery_days"] and run["status"] == "ok"
    assert "2 days" in llm.requests[1]["messages"][-1]["content"]  # the page's tool really ran
    bodies = [json.loads(code) for code in page_blocks("json")]
    for body in bodies:
        body |= {"trajectory_id": run["trajectory_id"], "feedback_token": run["feedback_token"]}
        answer = api.feedback(**body)
        assert answer.status_code == 202, (body, answer.text)
    assert sorted(b.get("kind", "score") for b in bodies) == FEEDBACK_KINDS
    assert api.feedback(**bodies[0]).status_code == 409  # each kind once per run
    assert all(b["user_id"] == request["user_id"] for b in bodies)
    out_of_range = api.feedback(**(bodies[1] | {"value": 7}))  # the page's 422 example
    assert (
        out_of_range.status_code == 422 and "rating takes a value from 1 to 5" in out_of_range.text
    )
    assert "rating takes a value from 1 to\n5" in PAGE.read_text()


def test_the_small_model_settings_serve_the_tiny_model_each_left_out_is_the_502_quoted(
    shop_pack, redis_url, start_api, monkeypatch
):
    env = small_model_env()
    assert env["ARLOOP_BASE_MODEL"] == "tiny"
    context, budget = quoted_502s()
    agent, request = run_request()
    for left_out, expected in (
        (None, None),
        ("ARLOOP_TOOL_FORMAT", context),
        ("ARLOOP_POLICY_MAX_TOKENS", budget),
    ):
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        if left_out:
            monkeypatch.delenv(left_out)
        settings = PolicyServerSettings(
            _env_file=None, redis_url=redis_url, port=free_port(), threads=1
        )
        with running_server(settings) as base:
            api = start_api(
                specs=None,
                packs=served_packs(),
                policy_api_base=base,
                policy_provider="arloop",
                policy_timeout_s=60,
            )
            r = api.http.post(f"/v1/agents/{agent}/runs", json=request)
            api.stop()
            config = AgentApiSettings(
                _env_file=None, policy_api_base=base, policy_provider="arloop"
            ).policy_config()
            fit = check_fit(
                agents_of([get_pack(p) for p in served_packs()], served_packs()), config
            )
        assert fit.unchecked == ""
        if expected is None:
            assert r.status_code == 200, r.text
            assert r.json()["policy_version"] == "v0"
            assert fit.problems == []  # `arloop serve agents` starts
        else:
            assert r.status_code == 502 and expected in r.json()["detail"], (left_out, r.text)
            # `arloop serve agents` refuses to start with that message (its counts are of the
            # first call with a one-word message, not the page's question), naming the agent
            said = [re.sub(r"\d+", "N", p) for p in fit.problems if f"agent {agent!r}" in p]
            assert [re.sub(r"\d+", "N", expected) in p for p in said] == [True], fit.problems
