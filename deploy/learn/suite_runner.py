"""The eval gate's legwork: run held-out suites through the real agent graph, gather the evidence.

Each eval task runs as a normal agent run against the policy server with the version pinned
(`arloop@v3`), on its own thread, without long-term memory, and lands on
`arloop:eval:trajectories`, a stream the learner never trains on. The server must answer with
the version asked for. Any failure of the policy server (down, 5xx, wrong version) makes the
verdict `error`: the gate fails closed. Then the learner's own code measures, on the logged
token ids, the KL to the base and the entropies, and reads the candidate's training batch and
held-out logged traffic from the store (reward-length correlation, reward-source disagreement,
the importance-weighted training reward, the off-policy estimate).
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import redis.asyncio as aioredis

from agents.events import STREAM_EVAL_TRAJECTORIES, TrajectoryEvent, new_id
from agents.packs import PackNotFound, get_pack
from agents.packs.base import Pack, Task
from agents.policy_client import PolicyClient, PolicyConfig, PolicyError
from agents.runtime import AgentRuntime
from agents.threads import Threads
from agents.trajectory_sink import TrajectorySink
from deploy.learn.settings import LearnerSettings
from learner.gate.eval_gate import GateConfig, GateReport, SuiteRun, TaskOutcome, decide, refuse
from learner.gate.evidence import answer_tokens
from learner.gate.guards import GuardConfig
from learner.policy.registry import CHAMPION, PolicyRegistry
from learner.store import Store

EVAL_USER = "arloop-eval"
SUITE, SERVER = "eval_suite", "policy_server"  # what a refusal names in `failed`


class EvalError(RuntimeError):
    """The suite could not be run (policy server down or erroring, wrong version served)."""

    failed = SERVER


class VerifierError(EvalError):
    """The pack's verifier crashed on a task: its scores cannot be trusted."""

    failed = SUITE


class SuiteMissing(RuntimeError):
    """A pack has no usable held-out suite; the message says which and why."""


def eval_tasks(pack: Pack) -> list[Task]:
    """The pack's held-out suite; SuiteMissing when it is missing or empty."""
    try:
        tasks = list(pack.tasks("eval"))
    except Exception as exc:
        raise SuiteMissing(f"pack {pack.name!r} has no eval suite: {exc}") from exc
    if not tasks:
        raise SuiteMissing(f"pack {pack.name!r} has an empty eval suite: add held-out tasks")
    return tasks


def outcome(pack: Pack, task: Task, t: TrajectoryEvent, solved_at: float) -> TaskOutcome:
    """One task's result as the gate sees it: verifier score, tool use, answer length.

    The score is the model's own answer's (`model_answer`): a pack's envelope escalates every
    red flag whatever the version, so judging what the user got would hide the model."""
    try:
        score = float(pack.verify(task, t.model_answer))
    except Exception as exc:
        raise VerifierError(f"verifier of {pack.name!r} failed on task {task.id}: {exc}") from exc
    used = task.needs_tool is not None and any(s.name == task.needs_tool for s in t.tool_steps)
    return TaskOutcome(
        task_id=f"{pack.name}/{task.id}",
        score=score,
        solved=score >= solved_at,
        needs_tool=task.needs_tool,
        used_tool=used,
        answer_tokens=answer_tokens(t),
        trajectory_id=t.event_id,
        escalated=_escalated(t),
    )


def _escalated(t: TrajectoryEvent) -> bool | None:
    """What the run's guard recorded: did the model itself escalate a red flag (None: none)."""
    said = t.metadata.get("arloop.model_escalated")
    return None if said is None else said == "true"


@dataclass
class SuiteRunner:
    """Runs packs' eval suites, one pinned version at a time, through `AgentRuntime`."""

    redis_url: str
    packs: Sequence[Pack]
    policy: PolicyConfig
    concurrency: int = 4
    solved_at: float = 1.0
    _cache: dict[str, tuple[SuiteRun, list[TrajectoryEvent]]] = field(
        default_factory=dict, init=False, repr=False
    )

    @property
    def suite(self) -> str:
        return "+".join(p.name for p in self.packs)

    def run(self, version: str) -> tuple[SuiteRun, list[TrajectoryEvent]]:
        """Every eval task under `version` (cached: a version's weights never change)."""
        if version not in self._cache:
            suites = [(p, eval_tasks(p)) for p in self.packs]  # SuiteMissing before any call
            self._cache[version] = asyncio.run(self._run_all(version, suites))
        return self._cache[version]

    async def _run_all(self, version: str, suites) -> tuple[SuiteRun, list[TrajectoryEvent]]:
        # generous timeouts: the gate shares a busy CPU with the model it is measuring
        client = aioredis.from_url(self.redis_url, socket_connect_timeout=30, socket_timeout=60)
        try:
            runtimes = {p.name: self._runtime(client, p) for p, _ in suites}
            gate = asyncio.Semaphore(self.concurrency)
            jobs = [
                self._one(runtimes[p.name], p, t, version, gate) for p, ts in suites for t in ts
            ]
            done = await asyncio.gather(*jobs)
        finally:
            await client.aclose()
        return SuiteRun(version, tuple(o for o, _ in done)), [t for _, t in done]

    def _runtime(self, client: aioredis.Redis, pack: Pack) -> AgentRuntime:
        return AgentRuntime(
            list(pack.agents),
            policy=PolicyClient(self.policy),
            threads=Threads(client, canary_share=0.0, ttl_s=3600),
            sink=TrajectorySink(client, stream=STREAM_EVAL_TRAJECTORIES),
        )

    async def _one(self, runtime: AgentRuntime, pack: Pack, task: Task, version: str, gate):
        async with gate:
            try:
                t = await runtime.run(
                    task.agent,
                    task.input,
                    EVAL_USER,
                    new_id("eval"),
                    {"arloop.eval": version, "arloop.task": task.id},
                    arm=version,
                )
            except PolicyError as exc:
                raise EvalError(
                    f"policy server failed while running {version} on {task.id}: {exc.reason}"
                ) from exc
        served = {s.policy_version for s in t.model_steps}
        if served != {version}:
            raise EvalError(
                f"asked the policy server for {version}, it answered with "
                f"{sorted(served)}: is it arloop's policy server?"
            )
        return outcome(pack, task, t, self.solved_at), t


class GateRunner:
    """Evaluates one version against the champion and decides; it moves no alias."""

    def __init__(
        self,
        registry: PolicyRegistry,
        suites: SuiteRunner,
        config: GateConfig,
        *,
        model_cache: Path,
        guards: GuardConfig | None = None,
        store: Store | None = None,
        max_user_share: float = 0.2,
    ) -> None:
        self.registry, self.suites, self.config = registry, suites, config
        self.guards = guards or GuardConfig()
        self.store, self.max_user_share, self.model_cache = store, max_user_share, model_cache

    def evaluate(self, version: str, champion: str | None = None) -> GateReport:
        """The report for `version` vs the champion (verdict `error` when it cannot judge)."""
        version = self.registry.resolve(version)
        champion = self.registry.resolve(champion or CHAMPION)
        suite = self.suites.suite
        if not self.suites.packs:
            return refuse(version, champion, SUITE, "no eval pack configured (ARLOOP_EVAL_PACKS)")
        start = time.perf_counter()
        try:
            base, _ = self.suites.run(champion)
            mine, trajectories = self.suites.run(version)
        except SuiteMissing as exc:
            return refuse(version, champion, SUITE, str(exc), suite=suite)
        except EvalError as exc:
            return refuse(version, champion, exc.failed, f"fail closed: {exc}", suite=suite)
        from learner.gate.figures import gather  # torch and the models: only past the suite

        runs_s, start = time.perf_counter() - start, time.perf_counter()
        evidence, ope, training = gather(
            self.registry,
            self.store,
            version,
            trajectories,
            max_user_share=self.max_user_share,
            ope_runs=self.config.ope_max_runs,
            min_ess=self.config.min_ess,
            model_cache=self.model_cache,
        )
        figures_s = time.perf_counter() - start
        report = decide(
            suite,
            mine,
            base,
            evidence,
            self.config,
            guard_config=self.guards,
            ope=ope,
            training=training,
        )
        return dataclasses.replace(report, seconds={"eval_runs": runs_s, "figures": figures_s})


def gate_runner(
    s: LearnerSettings,
    redis_url: str,
    registry: PolicyRegistry,
    store: Store | None,
    packs: Sequence[Pack] | None = None,
) -> GateRunner:
    """The gate as `arloop learn` and `arloop eval` run it; SuiteMissing for an unknown pack."""
    if packs is None:
        size = s.tutoring_eval_size
        try:
            packs = [
                get_pack(ref, tutoring_source=s.tutoring_source, tutoring_eval_size=size)
                for ref in s.eval_packs
            ]
        except PackNotFound as exc:
            raise SuiteMissing(str(exc)) from exc
    suites = SuiteRunner(
        redis_url, list(packs), s.policy_config(), s.eval_concurrency, s.gate.solved_at
    )
    return GateRunner(
        registry,
        suites,
        s.gate,
        guards=s.guards,
        model_cache=s.model_cache,
        store=store,
        max_user_share=s.round.max_user_reward_share,
    )
