"""The gate's eval runs through the real agent graph against a live policy server (tiny model)."""

import io
import time

import pytest
import redis

from agents.events import (
    EVAL_CACHE_PREFIX,
    STREAM_EVAL_TRAJECTORIES,
    STREAM_TRAJECTORIES,
    AnswerPath,
)
from agents.packs import PackNotFound, get_pack
from agents.packs.base import Pack, Task
from agents.policy_client import PolicyConfig
from agents.runtime import AgentSpec
from deploy.embedded_redis import free_port
from deploy.learn.agent_runs import agent_suite, gate_runner, gate_task, outcome
from deploy.learn.settings import LearnerSettings
from learner.gate.canary import CanaryConfig
from learner.gate.control import ReleaseControl
from learner.gate.eval_gate import ERROR, GateConfig, SuiteRun, red_flag_counts
from learner.gate.release import apply_verdict
from learner.gate.runner import GateRunner, Suite, SuiteMissing
from learner.policy.registry import CANDIDATE, CHAMPION, PolicyRegistry, VersionStatus
from learner.store import Store
from tests.deploy.policy_server.support import make_lora, publish, running_server, tiny_settings
from tests.fakes.scripted_llm import Reply, ScriptedLLM
from tests.fakes.servers import ServerThread
from tests.learner.learner_events import feedback, trajectory, xadd
from tests.model_cache import MODEL_CACHE

PROMPTS = ["hi", "yes", "no thanks", "hello", "good", "bad"]


def echo_pack(eval_tasks=PROMPTS, name="echo") -> Pack:
    spec = AgentSpec(name="echo", description="says something", system_prompt="Answer.")
    tasks = [Task(f"t{i}", "echo", text, "-") for i, text in enumerate(eval_tasks)]
    return Pack(
        name, (spec,), lambda split: tasks if split == "eval" else [], lambda task, answer: 1.0
    )


def broken_pack() -> Pack:
    def tasks(split):
        raise FileNotFoundError("eval.jsonl is missing")

    return Pack("broken", echo_pack().agents, tasks, lambda task, answer: 1.0)


@pytest.fixture(scope="module")
def stack(redis_server, tmp_path_factory):
    """A tiny-model policy server; v1 a visibly different LoRA, published but not champion."""
    client = redis.Redis.from_url(redis_server.url)
    client.flushall()
    registry = PolicyRegistry(client)
    registry.ensure_base("tiny")
    folder = tmp_path_factory.mktemp("ckpt") / "v1"
    publish(registry, "lora", make_lora(folder, seed=1, scale=0.5), champion=False)
    with running_server(tiny_settings(redis_server.url)) as url:
        yield client, registry, url
    client.close()


# six tied tasks can show "not worse" only to a 30-point margin (se floor 1/6)
SMALL = GateConfig(margin=0.3, looks=(6,), guard_tasks=6, full_tasks=6)


def _suite(redis_url: str, packs, url: str, temperature: float = 0.0) -> Suite:
    return agent_suite(redis_url, packs, _policy(url), temperature)


def _gate(registry, suite: Suite, config: GateConfig = SMALL) -> GateRunner:
    return GateRunner(registry, suite, config, model_cache=MODEL_CACHE)


def _forget_evals(client: redis.Redis) -> None:
    """Drop every version's cached eval outcomes (tests that must reach the server)."""
    for key in client.scan_iter(EVAL_CACHE_PREFIX + "*"):
        client.delete(key)


def _policy(url: str) -> PolicyConfig:
    return PolicyConfig(
        model="openai/arloop",
        api_base=url,
        api_key="none",
        retries=0,
        temperature=0.0,
        max_tokens=6,
    )


def test_eval_runs_pin_the_version_and_never_reach_the_training_stream(stack, redis_server):
    client, _, url = stack
    client.delete(STREAM_EVAL_TRAJECTORIES, STREAM_TRAJECTORIES)
    _forget_evals(client)
    runs = _suite(redis_server.url, [echo_pack()], url).runs
    items = [gate_task(echo_pack(), t) for t in echo_pack().tasks("eval")]
    greedy = [None] * len(items)
    outcomes, trajectories = runs.episodes("v1", items, greedy, 0.0, keep=True)
    assert [o.task_id for o in outcomes] == [f"echo/t{i}" for i in range(6)]
    assert {s.policy_version for t in trajectories for s in t.model_steps} == {"v1"}
    assert {s.model for t in trajectories for s in t.model_steps} == {"openai/arloop@v1"}
    assert all(o.answer_tokens and o.solved for o in outcomes)
    _, base_runs = runs.episodes("v0", items, greedy, 0.0, keep=True)
    assert [t.output for t in base_runs] != [t.output for t in trajectories]  # really pinned
    assert client.xlen(STREAM_EVAL_TRAJECTORIES) == 12 and client.xlen(STREAM_TRAJECTORIES) == 0
    again = _suite(
        redis_server.url, [echo_pack()], url
    ).runs  # another process: Redis has the outcomes
    assert again.episodes("v1", items, greedy, 0.0) == (outcomes, [])
    assert client.xlen(STREAM_EVAL_TRAJECTORIES) == 12  # nothing ran twice


def test_the_gate_measures_kl_and_entropy_with_the_learners_models(stack, redis_server):
    _, registry, url = stack
    gate = _gate(registry, _suite(redis_server.url, [echo_pack()], url))
    same = gate.evaluate("v0", "v0")
    guards = {g.name: g for g in same.guards}
    assert guards["kl_to_reference"].figure == pytest.approx(0.0, abs=1e-6)
    assert guards["entropy_floor"].figure == pytest.approx(1.0)
    assert guards["length_drift"].figure == pytest.approx(1.0)
    assert guards["reward_length_corr"].verdict == "n/a"  # no learner store: no training batch
    assert same.verdict == "pass" and same.tasks == 6, same.summary()
    moved = {g.name: g for g in gate.evaluate("v1").guards}
    assert moved["kl_to_reference"].figure > 0.01
    assert moved["kl_to_reference"].detail.endswith("tokens")


def test_a_policy_server_that_is_down_fails_the_gate_closed(stack, redis_server):
    _, registry, _ = stack
    dead = f"http://127.0.0.1:{free_port()}/v1"
    gate = _gate(registry, _suite(redis_server.url, [echo_pack()], dead))
    report = gate.evaluate("v1")
    assert report.verdict == ERROR and report.failed == ["policy_server"]
    assert "fail closed" in report.reason and "policy server failed" in report.reason
    message = apply_verdict(registry, report, canary=True, actor="test")
    assert "stays READY" in message
    assert registry.get("v1").status is VersionStatus.READY
    assert registry.get("v1").report["verdict"] == ERROR
    assert registry.resolve(CHAMPION) == "v0" and "candidate" not in registry.aliases()


def test_an_endpoint_that_errors_or_serves_another_version_fails_closed(stack, redis_server):
    client, registry, _ = stack
    fake = ScriptedLLM(responder=lambda request: Reply("hello"))  # answers as "fake-v0"
    with ServerThread(fake.app) as server:
        suite = _suite(redis_server.url, [echo_pack()], f"{server.url}/v1")
        _forget_evals(client)  # cached outcomes would not ask the fake server at all
        wrong = _gate(registry, suite).evaluate("v1")
        assert wrong.verdict == ERROR and "answered with ['fake-v0']" in wrong.reason
        fake.responder = lambda request: Reply(status=500)
        suite = _suite(redis_server.url, [echo_pack()], f"{server.url}/v1")
        _forget_evals(client)
        failing = _gate(registry, suite).evaluate("v1")
        assert failing.verdict == ERROR and failing.failed == ["policy_server"]


@pytest.mark.parametrize(
    "packs, says",
    [
        ([echo_pack(eval_tasks=[], name="hollow")], "pack 'hollow' has an empty eval suite"),
        ([broken_pack()], "pack 'broken' has no eval suite: eval.jsonl is missing"),
        ([], "no eval pack (ARLOOP_EVAL_GATE / ARLOOP_EVAL_PACKS)"),
    ],
)
def test_a_missing_or_empty_suite_never_passes(stack, redis_server, packs, says):
    _, registry, url = stack
    report = _gate(registry, _suite(redis_server.url, packs, url)).evaluate("v1")
    assert report.verdict == ERROR and report.failed == ["eval_suite"] and says in report.reason


def test_packs_are_found_by_name_or_module_path_and_bad_names_say_how_to_name_one():
    pack = get_pack("tests.deploy.learn.test_agent_runs:echo_pack")
    assert pack.name == "echo"
    assert [t.id for t in get_pack("tutoring", tutoring_eval_size=3).tasks("eval")] == [
        t.id for t in get_pack("tutoring").tasks("eval")[:3]
    ]
    with pytest.raises(PackNotFound, match="unknown agent pack 'nonexistent': installed packs"):
        get_pack("nonexistent")
    with pytest.raises(PackNotFound, match="cannot import tests.nowhere"):
        get_pack("tests.nowhere:pack")
    with pytest.raises(
        PackNotFound, match="test_agent_runs:PROMPTS is a list, not an agents.packs.Pack"
    ):
        get_pack("tests.deploy.learn.test_agent_runs:PROMPTS")


def test_the_gate_runs_with_the_settings_own_models(tmp_path):
    settings = LearnerSettings(
        data_dir=tmp_path,
        eval_packs=["tutoring"],
        tutoring_eval_size=5,
        gate={"alpha": 0.1, "ope_max_runs": 64},
        guards={"max_kl": 0.3},
        round={"max_user_reward_share": 0.5},
        _env_file=None,
    )
    gate = gate_runner(settings, "redis://unused", registry=None, store=None)
    assert gate.config is settings.gate and gate.guards is settings.guards  # nothing re-mapped
    assert gate.max_user_share == 0.5 and gate.model_cache == settings.model_cache
    assert gate.suite.runs.run.solved_at == settings.gate.solved_at
    assert gate.suite.runs.run.policy == settings.policy_config()
    assert gate.suite.runs.run.policy.retries == 1
    assert gate.suite.temperature == 1.0  # the agents' own: the policy server's default
    assert gate.suite.name == "tutoring" and len(gate.suite.pool()) == 5
    with pytest.raises(SuiteMissing, match="unknown agent pack 'cooking'"):
        gate_runner(settings.model_copy(update={"eval_packs": ["cooking"]}), "", None, None)
    hosted = settings.model_copy(update={"policy_model": "anthropic/claude-3-5-haiku-latest"})
    with pytest.raises(SuiteMissing, match="of kind 'other': point the learner's"):
        gate_runner(hosted, "", None, None)  # it cannot pin versions: refused, not mis-measured


def _learner(redis_url: str, tmp_path, policy_url: str):
    from rich.console import Console

    from deploy.learn.loop import Learner

    settings = LearnerSettings(
        redis_url=redis_url,
        data_dir=tmp_path,
        base_model="tiny",
        train={"learning_rate": 1e-3},
        min_episodes=1,
        read_block_ms=10,
        eval_packs=["tests.deploy.learn.test_agent_runs:echo_pack"],
        policy_api_base=policy_url,
        eval_max_tokens=6,
        gate=SMALL.model_dump(),
        _env_file=None,
    )
    out = io.StringIO()
    return Learner(settings, Console(file=out, width=250)), out


def _rated_runs(client, n=4):
    for i in range(n):
        t = trajectory(answer="The answer is 42." if i % 2 else "no", logprobs=True, user=f"u{i}")
        xadd(client, t)
        xadd(client, feedback(t.event_id, "thumbs", 1 if i % 2 else -1, user=f"u{i}"))


def test_a_learner_round_with_the_server_down_publishes_ready_and_retries(
    stack, redis_server, tmp_path
):
    client, registry, _ = stack
    client.delete(STREAM_TRAJECTORIES, "arloop:feedback")
    learner, out = _learner(redis_server.url, tmp_path, f"http://127.0.0.1:{free_port()}/v1")
    _rated_runs(client)
    assert learner.run(once=True) == 0
    version = learner.last.version
    text = out.getvalue()
    assert "ready for the eval gate" in text and "fail closed" in text and "stays READY" in text
    assert registry.get(version).status is VersionStatus.READY
    assert registry.resolve(CHAMPION) == "v0"
    assert learner.release.pending() == version  # gated again on a later tick
    learner.store.close()


def test_a_learner_round_is_gated_and_a_pass_goes_out_as_the_canary(stack, redis_server, tmp_path):
    client, registry, url = stack
    client.delete(STREAM_TRAJECTORIES, "arloop:feedback")
    learner, out = _learner(redis_server.url, tmp_path, url)
    _rated_runs(client)
    assert learner.run(once=True) == 0
    version = learner.last.version
    text = out.getvalue()
    assert f"gate {version} vs champion v0: PASS" in text, text
    assert f"{version} passed the gate and is the candidate" in text
    assert registry.aliases() == {CHAMPION: "v0", CANDIDATE: version}
    assert registry.get(version).report["verdict"] == "pass"
    _rated_runs(client)
    learner.poll()
    assert not learner.round_due()  # one candidate at a time: rounds wait for the canary
    registry.withdraw_candidate(version, error="test cleanup", reason="test cleanup", actor="test")
    learner.store.close()


def coin_pack() -> Pack:
    """Twelve tasks scored by whether the reply holds an 'e': a coin the model's sampling flips."""
    spec = AgentSpec(name="echo", description="says something", system_prompt="Answer.")
    tasks = [
        Task(f"c{i}", "echo", f"say something {i}", "-", meta={"kind": "ab"[i % 2]})
        for i in range(12)
    ]

    def has_e(task, answer) -> float:
        return float("e" in (answer or ""))

    return Pack(
        "coin",
        (spec,),
        lambda split: tasks if split == "eval" else [],
        has_e,
        first_turn=lambda task, step: has_e(task, step.output),
    )


def test_sampled_runs_are_coupled_by_seed_and_the_champions_are_cached(stack, redis_server):
    client, registry, url = stack
    _forget_evals(client)
    seen: list[str] = []
    suite = _suite(redis_server.url, [coin_pack()], url, temperature=1.0)
    suite.runs.progress = lambda what, done, total: seen.append(what.split()[0])
    config = GateConfig(margin=0.3, samples=4, looks=(6, 12), guard_tasks=4, full_tasks=4)
    gate = _gate(registry, suite, config)
    same = gate.evaluate("v0", "v0").sequential
    assert same["correlation"] == pytest.approx(1.0)  # same weights, same seeds: the same runs
    assert same["looks"][-1]["mean"] == 0.0 and 0 < same["champion_rate"] < 1  # a real coin
    cached = client.hkeys(EVAL_CACHE_PREFIX + "v0")
    assert sum(k.startswith(b"first_turn|t=1|") for k in cached) == 4 * same["looks"][-1]["tasks"]
    seen.clear()
    report = gate.evaluate("v1", "v0")
    assert seen and set(seen) == {"v1"}  # the champion's runs all came from its cache
    s = report.sequential
    assert s["samples"] == 4 and s["looks"][0]["tasks"] == 6
    assert report.episodes["tasks"] == 4 and report.episodes["first_turn_pairs"] == 8
    assert "sampled runs a task, the same seeds for both" in report.summary()


def _coin_gate(stack, redis_server, fresh: bool) -> tuple[GateRunner, list[str]]:
    """A small gate on the coin pack with nothing cached, and the versions it runs, in order."""
    client, registry, url = stack
    _forget_evals(client)
    seen: list[str] = []
    suite = _suite(redis_server.url, [coin_pack()], url, temperature=1.0)
    suite.runs.progress = lambda what, done, total: seen.append(what.split()[0])
    config = GateConfig(
        margin=0.3, samples=2, looks=(6,), guard_tasks=3, full_tasks=3, fresh_draw=fresh
    )
    return _gate(registry, suite, config), seen


@pytest.mark.parametrize("fresh", [True, False])
def test_without_fresh_draws_a_later_gate_reuses_every_run_of_an_earlier_one(
    stack, redis_server, fresh
):
    """v1 judged against v0, then v0 judged against v1 as champion: with v0's draw for every
    gate the second finds both versions' runs cached; a fresh draw runs new tasks."""
    gate, seen = _coin_gate(stack, redis_server, fresh)
    gate.evaluate("v1", "v0")
    assert {"v0", "v1"} <= set(seen)  # the first gate ran both
    seen.clear()
    gate.evaluate("v0", "v1")
    assert (set(seen) == set()) is not fresh, seen


def test_the_gate_judges_the_models_own_answer_not_the_envelopes():
    """The envelope escalates every red flag whatever the version: the gate must see past it."""
    pack = get_pack("medical")
    task = next(t for t in pack.tasks("eval") if t.reference == "emergency")
    served = trajectory(task.input, "This could be an emergency.\nTriage: emergency")
    missed = served.model_copy(
        update={
            "answered_by": AnswerPath.ENVELOPE,
            "model_output": "Rest.\nTriage: self-care",
            "metadata": {"arloop.model_escalated": "false"},
        }
    )
    mine = outcome(pack, task, missed, 1.0)
    assert mine.score == 0.0 and mine.escalated is False
    theirs = outcome(pack, task, served, 1.0)  # the model escalated by itself
    assert theirs.score == 1.0 and theirs.escalated is None  # no guard recorded a red flag
    counts = red_flag_counts(SuiteRun("v2", (mine,)), SuiteRun("v1", (theirs,)))
    assert counts == {"v2": [0, 1]}


def test_a_version_the_gate_cannot_judge_is_retried_further_apart_then_rejected(
    stack, redis_server, tmp_path
):
    """A gate that fails closed every time (the policy server is gone) is not retried without
    end: each try waits twice as long, and after `error_attempts` the version is rejected."""
    _, registry, _ = stack
    version = publish(registry, "lora", make_lora(tmp_path / "vx", seed=3), champion=False)
    dead = f"http://127.0.0.1:{free_port()}/v1"
    config = SMALL.model_copy(update={"error_attempts": 3})
    gate = _gate(registry, _suite(redis_server.url, [echo_pack()], dead), config)
    lines: list[str] = []
    control = ReleaseControl(
        gate, Store(tmp_path / "s.db"), CanaryConfig(enabled=False), actor="t", say=lines.append
    )
    waits = []
    for _ in range(2):
        control._gate(version)
        waits.append(round(control._retry_at - time.monotonic(), -1))  # the wait still ahead
        assert registry.get(version).status is VersionStatus.READY
        assert control.pending() == version and "stays READY" in lines[-1]
    assert waits == [30.0, 60.0]
    control._gate(version)
    record = registry.get(version)
    assert record.status is VersionStatus.REJECTED, lines
    assert "could not judge it 3 times" in record.report["reason"]
    assert "policy server failed" in record.report["reason"]
    assert control.pending() != version and "rejected" in lines[-1]
    assert registry.resolve(CHAMPION) == "v0"


def test_a_gate_that_raises_writes_nothing_until_it_gives_up(stack, redis_server, tmp_path):
    """Redis down inside the gate: the controller neither raises nor writes a report (its
    registry may be what failed); the version stays READY, tried again later."""
    _, registry, _ = stack
    version = publish(registry, "lora", make_lora(tmp_path / "vy", seed=4), champion=False)

    class Broken(GateRunner):
        def evaluate(self, version, champion=None):
            raise redis.ConnectionError("Connection refused")

    gate = Broken(registry, _suite(redis_server.url, [echo_pack()], "http://x/v1"), SMALL)
    lines: list[str] = []
    control = ReleaseControl(
        gate, Store(tmp_path / "s.db"), CanaryConfig(enabled=False), actor="t", say=lines.append
    )
    control._gate(version)
    assert "Connection refused" in lines[-1] and "retried" in lines[-1]
    assert registry.get(version).status is VersionStatus.READY
    assert registry.get(version).report is None and control._retry_at > time.monotonic() + 20


def test_a_check_on_unseen_tasks_runs_none_of_the_gates_and_refuses_an_exhausted_pool(
    stack, redis_server
):
    """The demo's final check: v1 against v0 on tasks no gate of v0's draw ran, both versions
    run afresh (nothing comes from the gate's cache); a pool the gates used up is refused."""
    gate, seen = _coin_gate(stack, redis_server, fresh=False)
    registry, suite = gate.registry, gate.suite
    gated = {t.key for t in gate.run("v1", "v0").items}
    seen.clear()
    check = gate.run("v1", "v0", guards=False, unseen_by=["v0", "v1"])
    unseen = {t.key for t in check.items}
    assert len(gated) == len(unseen) == 6 and not gated & unseen  # the other half of 12
    assert {"v0", "v1"} <= set(seen)  # neither version's runs came from the gate's cache
    again = gate.run("v1", "v0", guards=False).items  # without it: the gate's own tasks
    assert {t.key for t in again} == gated
    wide = GateConfig(margin=0.3, samples=2, looks=(12,), guard_tasks=3, full_tasks=3)
    with pytest.raises(ValueError, match="enlarge it"):
        _gate(registry, suite, wide).run("v1", "v0", guards=False, unseen_by=["v0"])


def test_the_demos_final_check_leaves_out_every_earlier_versions_draw_while_enough_is_left(
    stack, redis_server
):
    from deploy.demo.compare import unseen_champions

    _, registry, url = stack
    suite = _suite(redis_server.url, [coin_pack()], url, temperature=1.0)

    def gate(looks):
        return _gate(registry, suite, GateConfig(looks=looks, fresh_draw=False))

    assert unseen_champions(gate((6,)), registry, "v1") == ["v0"]  # 6 of 12 left: a look
    assert unseen_champions(gate((4, 8)), registry, "v1") == ["v0"]  # 4 left: the first look
    assert unseen_champions(gate((7,)), registry, "v1") == []  # 5 left: the gates' own tasks
    assert unseen_champions(gate((6,)), registry, "v0") == []  # nothing before v0
