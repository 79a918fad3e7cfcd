"""A pack that cannot fit the served model is said at the agent API's start (issue 35).

A team's own pack on the tiny model (512 tokens of context) failed with three 502s in turn, each
only when a user's first run reached the policy server. The agent API now sends each agent's
first call to the policy server's `POST /tokenize` (the chat call's own checks, nothing
generated) before it starts, and refuses in one line per agent, naming the fix.
"""

from __future__ import annotations

import asyncio

import httpx
import pytest

from agents.pack_fit import check_fit, first_call, watch_fit
from agents.policy_client import Generation, PolicyConfig
from agents.runtime import AgentSpec
from deploy.embedded_redis import free_port
from tests.deploy.policy_server.support import running_server, tiny_settings
from tests.deploy.test_first_hour import arloop, lines
from tools.calculator import Calculator

KEY = "agents-key-0123456789abcdef"
SENTENCE = "Answer the question and be kind. "  # 22 of the tiny model's tokens
LONG = SENTENCE * 30  # 660 tokens: over the tiny model's 512
HALF = SENTENCE * 18  # about 420 with the template: 128 more do not fit
PACK = f"""
from agents.packs import Pack
from agents.policy_client import Generation
from agents.runtime import AgentSpec

pack = Pack("mine", (
    AgentSpec(name="short", description="d", system_prompt="Be brief."),
    AgentSpec(name="wordy", description="d", system_prompt={LONG!r}),
))
"""


def config(base: str, key: str = KEY) -> PolicyConfig:
    return PolicyConfig(model="openai/arloop", api_base=base, api_key=key, max_tokens=64)


@pytest.fixture(scope="module")
def server(redis_server):
    """The tiny model's policy server (512 tokens of context), refusing over-long asks as a
    production server does (no clamp), with one agents' key."""
    settings = tiny_settings(
        redis_server.url, clamp_max_tokens=False, max_tokens_cap=128, policy_keys=[KEY]
    )
    with running_server(settings) as base:
        yield base


def tokenize(base: str, body: dict) -> httpx.Response:
    root = base.removesuffix("/v1")
    return httpx.post(f"{root}/tokenize", json=body, headers={"Authorization": f"Bearer {KEY}"})


def chat(base: str, body: dict) -> httpx.Response:
    headers = {"Authorization": f"Bearer {KEY}"}
    return httpx.post(f"{base}/chat/completions", json=body, headers=headers, timeout=60)


def test_tokenize_counts_the_prompt_the_chat_call_reads(server):
    body = first_call(AgentSpec(name="a", description="d", system_prompt="Be brief."), config(""))
    r = tokenize(server, body)
    assert r.status_code == 200, r.text
    got = r.json()
    assert got["max_model_len"] == 512 and got["max_tokens"] == 64
    assert got["count"] == len(got["tokens"]) > 0
    done = chat(server, body | {"max_tokens": 1})
    assert done.status_code == 200 and done.json()["usage"]["prompt_tokens"] == got["count"]


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"messages": [{"role": "user", "content": LONG}]}, "messages"),
        ({"max_tokens": 129}, "max_tokens"),  # over the server's cap
        ({"max_tokens": 128, "messages": [{"role": "user", "content": HALF}]}, "max_tokens"),
    ],
    ids=["prompt over the context", "over the cap", "over what the context leaves"],
)
def test_tokenize_refuses_what_the_chat_call_refuses_with_its_message(server, extra, param):
    body = {"model": "arloop", "messages": [{"role": "user", "content": "Hi"}]} | extra
    r, c = tokenize(server, body), chat(server, body)
    assert r.status_code == c.status_code == 400, (r.text, c.text)
    assert r.json()["error"] == c.json()["error"] and r.json()["error"]["param"] == param


def test_each_agent_that_does_not_fit_is_one_line_with_its_fix(server):
    short = AgentSpec(name="short", description="d", system_prompt="Be brief.")
    wordy = AgentSpec(name="wordy", description="d", system_prompt=LONG)
    greedy = AgentSpec(
        name="greedy",
        description="d",
        system_prompt="Be brief.",
        generation=Generation(max_tokens=500),
    )
    fit = check_fit([short, wordy, greedy], config(server))
    assert fit.unchecked == "" and len(fit.problems) == 2, fit.problems
    too_long, too_many = fit.problems
    assert (
        too_long.startswith("agent 'wordy': the policy server at ") and "context is 512" in too_long
    )
    assert "shorten the agent's system prompt and worked examples" in too_long
    assert too_many.startswith("agent 'greedy': ") and "max_tokens is 500" in too_many
    assert "lower the agent's Generation.max_tokens" in too_many
    assert check_fit([short], config(server)).problems == []
    tooled = AgentSpec(name="tooled", description="d", system_prompt=LONG, tools=(Calculator(),))
    [with_tools] = check_fit([tooled], config(server)).problems
    assert (
        "its tools' descriptions count: ARLOOP_TOOL_FORMAT=line on the policy server" in with_tools
    )


def test_a_refused_key_and_a_server_not_up_yet(server):
    spec = AgentSpec(name="short", description="d", system_prompt="Be brief.")
    refused = check_fit([spec], config(server, key="not-" + KEY)).problems
    assert len(refused) == 1 and "set ARLOOP_POLICY_API_KEY to one of" in refused[0]
    down = check_fit([spec], config(f"http://127.0.0.1:{free_port()}/v1"))
    assert down.problems == [] and "not checked" in down.unchecked
    other = PolicyConfig(model="openai/gpt-4o-mini", api_base=f"http://127.0.0.1:{free_port()}/v1")
    assert check_fit([spec], other) == check_fit([], other)  # another endpoint is not asked


def test_an_endpoint_without_tokenize_is_not_asked_again(llm):
    """An OpenAI-compatible server named like arloop's that has no `/tokenize` (the scripted
    one here): nothing to check, now or later, so nothing is polled."""
    spec = AgentSpec(name="short", description="d", system_prompt="Be brief.")
    fit = check_fit([spec], config(llm.base_url))
    assert fit == check_fit([], config(llm.base_url)) and fit.unchecked == ""


def test_arloop_serve_agents_refuses_a_pack_that_does_not_fit_one_line_per_agent(server, tmp_path):
    (tmp_path / "my_pack.py").write_text(PACK)
    result = arloop(
        "serve",
        "agents",
        "--port",
        str(free_port()),
        ARLOOP_PACKS='["my_pack:pack"]',
        ARLOOP_POLICY_API_BASE=server,
        ARLOOP_POLICY_API_KEY=KEY,
        ARLOOP_DATA_DIR=str(tmp_path),
        PYTHONPATH=str(tmp_path),
    )
    said = lines(result)  # the default ARLOOP_POLICY_MAX_TOKENS (512) is over the cap too
    assert len(said) == 2, said
    assert said[0].startswith("arloop serve agents: agent 'short': the policy server at ")
    assert "max_tokens is 512; this server writes at most 128" in said[0]
    assert "lower the agent's Generation.max_tokens (or ARLOOP_POLICY_MAX_TOKENS" in said[0]
    assert said[1].startswith("arloop serve agents: agent 'wordy': ")
    assert "this model's context is 512 tokens" in said[1]
    assert not (tmp_path / "redis").exists()  # refused before the embedded Redis started


def test_a_start_before_the_policy_server_checks_once_it_answers(server, caplog):
    """The demo starts the agent API and the policy server at once: the agent API's start
    finds nobody to ask, and asks again every few seconds until the server answers."""
    wordy = AgentSpec(name="wordy", description="d", system_prompt=LONG)
    down = config(f"http://127.0.0.1:{free_port()}/v1")
    calls = []

    def later(specs, cfg):  # the first ask finds the server down, the second finds it up
        calls.append(cfg)
        return check_fit(specs, down if len(calls) == 1 else config(server))

    with pytest.MonkeyPatch.context() as patch, caplog.at_level("ERROR", logger="agents.pack_fit"):
        patch.setattr("agents.pack_fit.check_fit", later)
        asyncio.run(asyncio.wait_for(watch_fit([wordy], down, every_s=0.01), timeout=30))
    assert len(calls) == 2
    assert [r.getMessage()[:26] for r in caplog.records] == ["agent 'wordy': the policy "]
