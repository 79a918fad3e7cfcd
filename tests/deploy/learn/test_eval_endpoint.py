"""The gate's runs of a team's own agent (`Pack.run`, no AgentSpec): the team's code pointed at
the recording endpoint under the judged version, each call a step with its tokens, sampled as
the gate says; a run that fails, or answers without calling, fails the gate closed."""

from __future__ import annotations

import asyncio

import pytest
import redis.asyncio as aioredis
from openai import OpenAI

from agents.events import STREAM_EVAL_TRAJECTORIES, decode
from agents.packs import PackNotFound, get_pack
from agents.packs.base import Pack, Task
from agents.policy_client import PolicyConfig
from agents.runtime import AgentSpec
from deploy.learn.agent_runs import AgentRuns, TeamRunError, agent_suite, gate_task
from learner.gate.eval_gate import ERROR, GateConfig
from learner.gate.eval_runs import SAMPLED, SUITE, Job
from learner.gate.runner import GateRunner
from learner.policy.registry import PolicyRegistry
from learner.store import Store
from tests.fakes.scripted_llm import Reply

TASK = Task("t1", "team-bot", "What is 2+3?", "5", "add", {"kind": "sum"})
ADD = {
    "type": "function",
    "function": {"name": "add", "description": "Add.", "parameters": {"type": "object"}},
}


def tool_loop(task: Task, base_url: str, model: str, headers: dict[str, str]) -> str:
    """A team's OpenAI-SDK agent: one tool call, then the answer (it asks for its own
    sampling, which the gate overrides)."""
    client = OpenAI(base_url=base_url, api_key="x", default_headers=headers, max_retries=0)
    messages = [{"role": "user", "content": task.input}]
    first = client.chat.completions.create(
        model=model, messages=messages, tools=[ADD], temperature=0.0, seed=1
    )
    call = first.choices[0].message.tool_calls[0]
    messages += [
        first.choices[0].message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": "5"},
    ]
    second = client.chat.completions.create(model=model, messages=messages, tools=[ADD])
    return second.choices[0].message.content


def team_pack(run=tool_loop) -> Pack:
    return Pack(
        "team-bot",
        tasks=lambda split: [TASK] if split == "eval" else [],
        verify=lambda task, answer: float(answer.strip().endswith(task.reference)),
        run=run,
    )


def _policy(llm) -> PolicyConfig:
    return PolicyConfig(
        model="openai/arloop", api_base=llm.base_url, api_key="k", retries=0, max_tokens=32
    )


def _run(redis_url: str, pack: Pack, llm, version: str = "v1"):
    """One sampled eval job of the pack's task through `AgentRuns`."""
    runs = AgentRuns([pack], _policy(llm))
    runs.pool()

    async def go():
        client = aioredis.from_url(redis_url)
        try:
            job = Job(version, SAMPLED, 0.7, 1234, gate_task(pack, TASK))
            return await runs(client)(job)
        finally:
            await client.aclose()

    return asyncio.run(go())


def test_a_team_run_is_recorded_call_by_call_under_the_judged_version(llm, redis_url, redis_client):
    llm.fingerprints = {"arloop@v1": "v1"}
    llm.push(Reply(tool_calls=[("add", '{"a": 2, "b": 3}')]), Reply(content="It is 5"))
    result, trajectory = _run(redis_url, team_pack(), llm)
    assert result.solved and result.task_id == "team-bot/t1" and result.used_tool
    assert [r["model"] for r in llm.requests] == ["arloop@v1", "arloop@v1"]
    # the gate's sampling, not the team's: champion and candidate run alike
    assert [(r["temperature"], r["seed"]) for r in llm.requests] == [(0.7, 1234)] * 2
    assert all(r["max_tokens"] == 32 for r in llm.requests)
    steps = trajectory.model_steps
    assert [s.index for s in steps] == [0, 1] and {s.policy_version for s in steps} == {"v1"}
    assert all(s.completion_token_ids and s.prompt_token_ids for s in steps)
    assert steps[1].messages[-1]["role"] == "tool"  # the tool's output: in the prompt only
    assert (trajectory.agent, trajectory.output, trajectory.input) == (
        "team-bot",
        "It is 5",
        "What is 2+3?",
    )
    [logged] = [decode(f) for _, f in redis_client.xrange(STREAM_EVAL_TRAJECTORIES)]
    assert logged.trajectory_id == trajectory.trajectory_id
    assert logged.metadata["arloop.eval"] == "v1" and logged.metadata["arloop.task"] == "t1"


def _fails(run) -> None:
    raise RuntimeError("the team's bug")


def _silent(task, base_url, model, headers) -> str:
    return "5"


def _other_model(task, base_url, model, headers) -> str:
    client = OpenAI(base_url=base_url, api_key="x", default_headers=headers, max_retries=0)
    messages = [{"role": "user", "content": task.input}]
    return client.chat.completions.create(model="gpt-4o", messages=messages).choices[0].message


@pytest.mark.parametrize(
    "run, says",
    [
        (lambda *args: _fails(args), "RuntimeError: the team's bug"),
        (_silent, "without calling the base_url"),
        (_other_model, "this run judges 'arloop@v1'"),
    ],
)
def test_a_team_run_that_fails_or_never_calls_fails_the_gate_closed(llm, redis_url, run, says):
    llm.fingerprints = {"arloop@v1": "v1"}
    with pytest.raises(TeamRunError, match=says) as failed:
        _run(redis_url, team_pack(run), llm)
    assert failed.value.failed == SUITE and llm.requests == []


def test_a_pack_for_a_team_agent_loads_without_agents_and_not_with_both():
    assert get_pack("tests.deploy.learn.test_eval_endpoint:team_pack").run is tool_loop
    assert not team_pack().agents and team_pack().has_eval_suite()
    with pytest.raises(PackNotFound, match="has agents beside its run"):
        get_pack("tests.deploy.learn.test_eval_endpoint:both")


def both() -> Pack:
    spec = AgentSpec(name="echo", description="says something", system_prompt="Answer.")
    return Pack("both", (spec,), run=tool_loop)


def test_a_team_agent_without_tasks_is_named_unjudged_and_never_released_without_a_canary(
    llm, redis_url, redis_client, tmp_path
):
    """Without held-out tasks the release rests on the guards and the canary
    (tests/learner/gate/test_integrity_scenarios.py judges real rounds so); with the canary
    off, or no learner store to read the training from, nothing would judge it: refused."""
    registry = PolicyRegistry(redis_client)
    registry.ensure_base("tiny")
    feedback_only = Pack("chat-bot", run=tool_loop)  # no tasks, no verifier
    suite = agent_suite(redis_url, [feedback_only], _policy(llm), 1.0)
    assert suite.name == "" and suite.unjudged == ("chat-bot",)
    store = Store(tmp_path / "store.db")
    for canary, kept, says in (
        (False, store, "the canary is off"),
        (True, None, "there is no learner store"),
    ):
        gate = GateRunner(registry, suite, GateConfig(), store=kept, canary=canary)
        report = gate.evaluate("v0", "v0")
        assert report.verdict == ERROR and report.failed == [SUITE], report.reason
        assert f"learn from feedback alone) and {says}: nothing would judge" in report.reason
        assert report.unjudged == ["chat-bot"]
        assert "not judged on held-out tasks (no eval suite): chat-bot" in report.summary()
    store.close()
    assert llm.requests == []


def test_a_team_pack_whose_tasks_fail_to_load_is_an_eval_suite_error(llm, redis_url, redis_client):
    def tasks(split):
        raise FileNotFoundError("eval.jsonl is missing")

    registry = PolicyRegistry(redis_client)
    registry.ensure_base("tiny")
    broken = Pack("team-bot", tasks=tasks, verify=lambda task, answer: 1.0, run=tool_loop)
    suite = agent_suite(redis_url, [broken], _policy(llm), 1.0)
    assert suite.unjudged == ()  # not taken for a feedback-only agent
    report = GateRunner(registry, suite, GateConfig()).evaluate("v0", "v0")
    assert report.verdict == ERROR and report.failed == [SUITE]
    assert "pack 'team-bot' has no eval suite: eval.jsonl is missing" in report.reason
