"""The two agents of `examples/` (plain LangGraph, plain OpenAI SDK) through the whole loop:
served through the agent API's `/v1/chat/completions` on the tiny-model policy server, rated
by `POST /v1/feedback`, trained on by a learner round, and the round's version gated by the
gate calling each team's own `run`, for champion and candidate alike."""

from __future__ import annotations

import dataclasses
from collections import Counter

from openai import OpenAI

from agents.events import STREAM_EVAL_TRAJECTORIES, STREAM_TRAJECTORIES, decode
from agents.packs import get_pack
from agents.policy_client import PolicyConfig
from deploy.learn.agent_runs import agent_suite
from deploy.learn.plan import groundings
from learner.gate.eval_gate import ERROR, GateConfig
from learner.gate.runner import GateRunner
from learner.policy.registry import CHAMPION, PolicyRegistry, VersionStatus
from learner.rounds import run_round
from learner.trajectory_source import TrajectorySource
from tests.deploy.policy_server.support import running_server, tiny_settings
from tests.examples.langgraph_tutor import agent as graph_tutor
from tests.examples.langgraph_tutor.pack import NAME as GRAPH
from tests.examples.openai_sdk_tutor import agent as sdk_tutor
from tests.examples.openai_sdk_tutor.pack import NAME as SDK
from tests.fakes.api import API_KEY
from tests.learner.learner_fixtures import open_store, tiny_round_plan
from tests.model_cache import MODEL_CACHE

PACKS = {
    SDK: "tests.examples.openai_sdk_tutor.pack:pack",
    GRAPH: "tests.examples.langgraph_tutor.pack:pack",
}
EVAL_TASKS = 3
TRAIN_RUNS = 4


def serve(name: str, base_url: str, question: str, run: str) -> tuple[str, dict[str, str]]:
    """The team's service answering one user: its own agent, through the agent API."""
    headers = {"X-Arloop-Run": run, "X-Arloop-Agent": name}
    if name == SDK:
        client = OpenAI(base_url=base_url, api_key=API_KEY, default_headers=headers, max_retries=0)
        answer, got = sdk_tutor.solve(client, question)
    else:
        answer, got = graph_tutor.solve(
            graph_tutor.chat_model(base_url, API_KEY, "arloop", headers), question
        )
    return answer, {k.lower(): v for k, v in got.items()}


def counted(pack, calls: Counter):
    """The pack with its own `run`, each call counted by (agent and task, model)."""
    own = pack.run

    def run(task, base_url, model, headers):
        calls[(f"{task.agent}/{task.id}", model)] += 1
        return own(task, base_url, model, headers)

    return dataclasses.replace(pack, run=run)


def test_both_examples_learn_from_feedback_and_are_gated_by_their_own_run(
    start_api, redis_url, redis_client, tmp_path
):
    registry = PolicyRegistry(redis_client)
    registry.ensure_base("tiny")
    packs = {name: get_pack(ref, tutoring_eval_size=EVAL_TASKS) for name, ref in PACKS.items()}
    with running_server(tiny_settings(redis_url, tool_format="line")) as policy_base:
        api = start_api(policy_api_base=policy_base, policy_api_key="none", policy_max_tokens=8)
        base_url = f"{api.server.url}/v1"
        served = {}
        for k, (name, pack) in enumerate(packs.items()):
            problems = pack.tasks("train")[k * TRAIN_RUNS : (k + 1) * TRAIN_RUNS]
            for i, task in enumerate(problems):
                answer, headers = serve(name, base_url, task.input, f"{name}-{i}")
                trajectory_id = headers["x-arloop-trajectory"]
                ended = api.http.post(f"/v1/runs/{trajectory_id}/end", json={"output": answer})
                assert ended.status_code == 200, ended.text
                rated = api.feedback(
                    trajectory_id=trajectory_id,
                    feedback_token=ended.json()["feedback_token"],
                    kind="thumbs",
                    value=1 if i % 2 else -1,  # a user who likes every other answer
                )
                assert rated.status_code == 202, rated.text
                served[trajectory_id] = (name, answer)

        logged = [decode(f) for _, f in redis_client.xrange(STREAM_TRAJECTORIES)]
        assert {t.trajectory_id: (t.agent, t.output) for t in logged} == served
        assert Counter(t.agent for t in logged) == {SDK: TRAIN_RUNS, GRAPH: TRAIN_RUNS}
        assert all(t.metadata["arloop.source"] == "chat_completions" for t in logged)
        steps = [s for t in logged for s in t.model_steps]
        assert steps and all(s.prompt_token_ids and s.completion_token_ids for s in steps)
        assert all(s.messages[0]["content"] == sdk_tutor.SYSTEM for s in steps)
        assert all(s.tool_names == ["calculator"] for s in steps)  # each team's own tool spec

        # the learner: the teams' runs, their agents in no AgentSpec, train as our own
        store = open_store(tmp_path)
        source = TrajectorySource(redis_client, store, "learner-1", block_ms=10)
        source.ensure_groups()
        while not source.poll().caught_up:
            pass
        plan = dataclasses.replace(
            tiny_round_plan(tmp_path),
            promote=False,  # the gate decides
            grounding=groundings(list(packs.values()), "line"),
        )
        assert set(plan.grounding) == {SDK, GRAPH}
        result = run_round(store, registry, plan)
        assert result is not None and (result.version, result.parent) == ("v1", "v0")
        assert result.episodes == 2 * TRAIN_RUNS
        assert set(served) <= set(store.ledger())  # every team run trained into v1
        assert registry.get("v1").status is VersionStatus.READY
        m = result.metrics  # each a lone answer, judged by thumbs: KTO, as our own agents'
        assert m["reward_sources/kto_judged"] + m["reward_sources/feedback"] == 2 * TRAIN_RUNS

        # the gate: each pack's own run, pointed at v0 and at v1, same tasks and seeds
        calls: Counter = Counter()
        policy = PolicyConfig(
            model="openai/arloop",
            api_base=policy_base,
            api_key="none",
            retries=0,
            temperature=1.0,
            max_tokens=8,
        )
        chat = dataclasses.replace(packs[SDK], name="chat-bot", tasks=lambda split: [])
        gated = [counted(p, calls) for p in packs.values()] + [counted(chat, calls)]
        suite = agent_suite(redis_url, gated, policy, 1.0)
        n = 2 * EVAL_TASKS
        config = GateConfig(
            margin=0.5, samples=2, looks=(n,), guard_tasks=n, full_tasks=n, min_ess=0.0
        )
        report = GateRunner(registry, suite, config, model_cache=MODEL_CACHE).evaluate("v1")
    assert report.verdict != ERROR, report.reason
    assert report.tasks == n and report.suite == f"{SDK}+{GRAPH}"
    assert report.sequential is not None
    # an agent learned from feedback alone is named, not run: its release is the canary's
    assert report.unjudged == ["chat-bot"] and "chat-bot; their agents'" in report.summary()
    guards = {g.name: g for g in report.guards}
    assert guards["kl_to_reference"].figure > 0  # measured on the team's v1 runs' tokens
    tasks = {task for task, _ in calls}
    assert len(tasks) == n
    for task in tasks:  # champion and candidate, the same runs of the same tasks
        assert calls[(task, "arloop@v0")] == calls[(task, "arloop@v1")] > 0
    evals = [decode(f) for _, f in redis_client.xrange(STREAM_EVAL_TRAJECTORIES)]
    assert {t.agent for t in evals} == {SDK, GRAPH}
    assert {t.metadata["arloop.eval"] for t in evals} == {"v0", "v1"}
    for t in evals:
        assert {s.policy_version for s in t.model_steps} == {t.metadata["arloop.eval"]}
        assert all(s.completion_token_ids for s in t.model_steps)
    assert redis_client.xlen(STREAM_TRAJECTORIES) == 2 * TRAIN_RUNS  # eval runs never train
    assert registry.resolve(CHAMPION) == "v0"  # the gate judged; it moved nothing
