"""Denial of service through a tool: hostile arithmetic is refused at once, a tool that never
yields is killed at its timeout, and the agent API keeps answering meanwhile."""

from __future__ import annotations

import json
import threading

import pytest

from agents.events import STREAM_TRAJECTORIES, decode
from agents.runtime import AgentSpec
from tests.fakes.scripted_llm import Reply
from tests.fakes.tools import Spin, SpinUntil
from tools import Calculator

HOSTILE = ["1e9999999", "1e29999999", "1e-9999999", "9**9**9", "-" * 400 + "1"]


def specs() -> list[AgentSpec]:
    tools = (Calculator(), Spin(), SpinUntil())
    return [AgentSpec(name="tutor", description="", system_prompt="Add.", tools=tools)]


@pytest.mark.parametrize("expression", HOSTILE)
def test_hostile_arithmetic_is_a_tool_error_not_a_stall(start_api, llm, redis_client, expression):
    call = json.dumps({"expression": expression})
    llm.push(Reply(tool_calls=[("calculator", call)]), Reply(content="done"))
    api = start_api(specs=specs())
    reply = api.run("compute")
    assert reply.status_code == 200, reply.text
    [(_, fields)] = redis_client.xrange(STREAM_TRAJECTORIES)
    [step] = decode(fields).tool_steps
    assert step.error == "tool_error", step.output
    assert llm.requests[1]["messages"][-1]["content"] == step.output


def test_healthz_answers_while_a_tool_computes_without_yielding(start_api, llm, tmp_path):
    """The run's tool computes until a flag file exists, and the flag is only written once
    /healthz has answered: had the tool run on the event loop, /healthz could not answer
    (it fails after 30 s instead) and the run would never end."""
    flag = tmp_path / "release"
    call = json.dumps({"path": str(flag)})
    llm.push(Reply(tool_calls=[("spin_until", call)]), Reply(content="done"))
    api = start_api(specs=specs())
    replies: list = []
    runner = threading.Thread(target=lambda: replies.append(api.run("spin please")))
    runner.start()
    try:
        while not llm.requests:  # the model has been asked; its tool call comes next
            runner.join(0.02)
        health = api.http.get("/healthz", timeout=30)
        still_running = runner.is_alive()
    finally:
        flag.touch()
        runner.join(timeout=60)
    assert health.status_code == 200 and still_running
    assert replies[0].status_code == 200
    assert llm.requests[1]["messages"][-1]["content"] == "released"


def test_a_tool_that_never_yields_is_stopped_by_its_timeout(start_api, llm):
    llm.push(Reply(tool_calls=[("spin", "{}")]), Reply(content="gave up"))
    api = start_api(specs=specs())
    reply = api.run("spin please")
    assert reply.status_code == 200 and reply.json()["output"] == "gave up"
    assert llm.requests[1]["messages"][-1]["content"] == "Error: spin timed out after 1 s."
