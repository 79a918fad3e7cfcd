"""The ReAct graph against a scripted endpoint: tool loop, step budget, faulty tools, threads."""

from __future__ import annotations

import json

import pytest

from agents.events import STREAM_TRAJECTORIES, ModelStep, RunStatus, ToolStep, decode
from agents.policy_client import PolicyConfig, PolicyError
from agents.react import BUDGET_NOTE
from agents.runtime import AgentRuntime, AgentSpec
from tests.fakes.scripted_llm import Reply
from tests.fakes.tools import Add, Explode, Flood, Hang

SYSTEM = "You are a careful maths tutor."


def runtime(aredis, llm, *specs: AgentSpec) -> AgentRuntime:
    policy = PolicyConfig(model="openai/arloop", api_base=llm.base_url, api_key="k", retries=0)
    return AgentRuntime.on_redis(aredis, list(specs), policy)


def tutor(**kw) -> AgentSpec:
    return AgentSpec(name="tutor", description="d", system_prompt=SYSTEM, tools=(Add(),), **kw)


async def stream_events(aredis) -> list:
    return [decode(fields) for _, fields in await aredis.xrange(STREAM_TRAJECTORIES)]


async def test_tool_loop_is_recorded_exactly_as_sent_and_received(aredis, llm):
    llm.fingerprints = {"arloop@champion": "v7"}
    llm.push(Reply(tool_calls=[("add", '{"a": 2, "b": 3}')]), Reply(content="2 + 3 = 5"))
    event = await runtime(aredis, llm, tutor()).run("tutor", "What is 2+3?", "u1")

    assert event.output == "2 + 3 = 5" and event.status is RunStatus.OK
    assert [type(s) for s in event.steps] == [ModelStep, ToolStep, ModelStep]
    assert [s.index for s in event.steps] == [0, 1, 2]
    first, tool, second = event.steps
    assert tool.name == "add" and tool.output == "5" and tool.error is None
    for step, request, response in zip([first, second], llm.requests, llm.responses, strict=True):
        choice = response["choices"][0]
        assert request["model"] == "arloop@champion"
        assert step.messages == request["messages"]
        assert step.tool_names == ["add"] == [t["function"]["name"] for t in request["tools"]]
        assert step.prompt_token_ids == response["prompt_token_ids"]
        assert step.completion_token_ids == choice["token_ids"]
        assert step.logprobs == [t["logprob"] for t in choice["logprobs"]["content"]]
        assert step.policy_version == "v7"
    assert llm.requests[0]["messages"] == [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": "What is 2+3?"},
    ]
    call_id = first.tool_calls[0].id
    assert llm.requests[1]["messages"][2:] == [
        {
            "role": "assistant",
            "tool_calls": [
                {
                    "id": call_id,
                    "type": "function",
                    "function": {"name": "add", "arguments": '{"a": 2, "b": 3}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": call_id, "content": "5"},
    ]
    assert event.policy_version == "v7"
    assert await stream_events(aredis) == [event]


async def test_step_budget_stops_the_loop(aredis, llm):
    llm.responder = lambda request: Reply(tool_calls=[("add", '{"a": 1, "b": 1}')])
    event = await runtime(aredis, llm, tutor(max_steps=3)).run("tutor", "loop forever", "u1")

    assert event.status is RunStatus.STEP_BUDGET
    assert event.output == BUDGET_NOTE
    assert len(llm.requests) == 3
    assert [s.kind for s in event.steps] == ["model", "tool", "model", "tool", "model"]
    assert event.steps[-1].tool_calls  # the refused call is still on the record


async def test_tools_that_raise_hang_or_flood_become_error_observations(aredis, llm):
    spec = AgentSpec(
        name="t", description="d", system_prompt=SYSTEM, tools=(Explode(), Hang(), Flood())
    )
    llm.push(
        Reply(tool_calls=[("explode", "{}"), ("hang", "{}"), ("flood", "{}"), ("nope", "{}")]),
        Reply(content="Tools are broken today."),
    )
    event = await runtime(aredis, llm, spec).run("t", "try your tools", "u1")

    assert event.status is RunStatus.OK and event.output == "Tools are broken today."
    tools = event.tool_steps
    assert [t.name for t in tools] == ["explode", "hang", "flood", "nope"]
    assert [t.error for t in tools] == ["exception", "timeout", None, "unknown_tool"]
    assert tools[2].truncated and len(tools[2].output) < 1200
    observations = [m for m in llm.requests[1]["messages"] if m["role"] == "tool"]
    assert [m["content"] for m in observations] == [t.output for t in tools]
    assert "timed out" in observations[1]["content"]


async def test_thread_continues_across_runs(aredis, llm):
    rt = runtime(aredis, llm, tutor())
    llm.push(Reply(content="Hi Sam."), Reply(content="You are Sam."))
    first = await rt.run("tutor", "I am Sam.", "u1")
    second = await rt.run("tutor", "Who am I?", "u1", thread_id=first.thread_id)

    assert second.thread_id == first.thread_id
    assert [m["content"] for m in llm.requests[1]["messages"]] == [
        SYSTEM,
        "I am Sam.",
        "Hi Sam.",
        "Who am I?",
    ]
    llm.push(Reply(content="No idea."))
    other = await rt.run("tutor", "Who am I?", "u1")  # no thread id: a new thread
    assert [m["content"] for m in llm.requests[2]["messages"]] == [SYSTEM, "Who am I?"]
    assert other.thread_id != first.thread_id


async def test_litellm_sees_tools_as_json_schema(aredis, llm):
    llm.push(Reply(content="ok"))
    await runtime(aredis, llm, tutor()).run("tutor", "hi", "u1")
    params = llm.requests[0]["tools"][0]["function"]["parameters"]
    assert params["required"] == ["a", "b"]
    assert json.loads(json.dumps(params))["properties"]["a"]["type"] == "number"


async def test_a_failed_run_leaves_the_thread_as_it_was(aredis, llm):
    rt = runtime(aredis, llm, tutor())
    llm.push(
        Reply(content="one"),
        Reply(tool_calls=[("add", '{"a": 1, "b": 2}')]),
        Reply(status=500),
        Reply(content="three"),
    )
    first = await rt.run("tutor", "first", "u1")
    with pytest.raises(PolicyError):
        await rt.run("tutor", "second", "u1", thread_id=first.thread_id)
    third = await rt.run("tutor", "third", "u1", thread_id=first.thread_id)
    assert [m["content"] for m in llm.requests[-1]["messages"]] == [SYSTEM, "first", "one", "third"]
    assert third.output == "three"
    assert len(await stream_events(aredis)) == 2  # the failed run wrote no trajectory
