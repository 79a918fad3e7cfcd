"""The gate as `arloop learn` and `arloop eval` build it: the packs' held-out tasks as plain
`GateTask`s, and the runner that runs each through the agent graph.

A team's own agent (a pack with `run`, no `AgentSpec`) runs in the team's code instead,
pointed at the gate's recording endpoint (`deploy/learn/eval_endpoint.py`) with the version's
name: its calls are the run's steps, its return value the answer the pack's verifier scores.

The gate itself (`learner/gate/runner.py`) knows no agent; its eval runs
(`learner/gate/eval_runs.py`) batch, couple and cache, and call `AgentRuns` for each run
that is not cached. Each run asks the policy server for the version by name (`arloop@v3`) with
its own sampling seed; whole runs land on `arloop:eval:trajectories`, which is never trained
on. A policy server that fails, or answers with another version, is an `EvalError`: the gate
fails closed.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import redis.asyncio as aioredis

from agents.events import STREAM_EVAL_TRAJECTORIES, ModelStep, RunStatus, TrajectoryEvent, new_id
from agents.packs import PackNotFound, get_pack
from agents.packs.base import Pack, Task
from agents.policy_client import PolicyClient, PolicyConfig, PolicyError
from agents.runtime import AgentRuntime
from agents.threads import Threads
from agents.trajectory_sink import TrajectorySink
from deploy.learn.eval_endpoint import MODEL, RUN_HEADER, EvalEndpoint
from deploy.learn.settings import LearnerSettings
from learner.gate.eval_gate import TaskOutcome
from learner.gate.eval_runs import (
    FIRST_TURN,
    SUITE,
    EvalError,
    EvalRuns,
    GateTask,
    Job,
    Progress,
    Ran,
    VerifierError,
)
from learner.gate.evidence import answer_tokens
from learner.gate.runner import GateRunner, Looked, Suite, SuiteMissing
from learner.policy.registry import PolicyRegistry
from learner.store import Store

EVAL_USER = "arloop-eval"


class TeamRunError(EvalError):
    """A team's `run` failed, or answered without calling the endpoint: its runs cannot be
    scored, and a tie of two failing versions must not release one."""

    failed = SUITE


def eval_tasks(pack: Pack) -> list[Task]:
    """The pack's held-out pool; SuiteMissing when it is missing or empty."""
    try:
        tasks = list(pack.tasks("eval"))
    except Exception as exc:
        raise SuiteMissing(f"pack {pack.name!r} has no eval suite: {exc}") from exc
    if not tasks:
        raise SuiteMissing(f"pack {pack.name!r} has an empty eval suite: add held-out tasks")
    return tasks


def gate_task(pack: Pack, task: Task) -> GateTask:
    """What the gate needs to know of one of a pack's tasks."""
    spec = next((a for a in pack.agents if a.name == task.agent), None)
    temperature = spec.generation.temperature if spec and spec.generation else None
    return GateTask(
        key=f"{pack.name}/{task.id}",
        stratum=f"{pack.name}/{task.meta.get('kind', task.agent)}",
        first_turn=pack.first_turn is not None and pack.run is None,
        samples=temperature is None or temperature > 0,
    )


def outcome(pack: Pack, task: Task, t: TrajectoryEvent, solved_at: float) -> TaskOutcome:
    """One whole run's result as the gate sees it: verifier score, tool use, answer length.

    The score is the model's own answer's (`model_answer`): a pack's envelope escalates every
    red flag whatever the version, so judging what the user got would hide the model."""
    try:
        score = float(pack.verify(task, t.model_answer))
    except Exception as exc:
        raise VerifierError(f"verifier of {pack.name!r} failed on task {task.id}: {exc}") from exc
    if pack.run is None:
        named = [s.name for s in t.tool_steps]
    else:  # a team's agent runs its tools itself: what the model asked for is what it used
        named = [c.name for s in t.model_steps for c in s.tool_calls]
    used = task.needs_tool is not None and task.needs_tool in named
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
class AgentRuns:
    """The eval runs' runner (`learner.gate.eval_runs.Runner`): one job through the agent
    graph of its task's pack."""

    packs: Sequence[Pack]
    policy: PolicyConfig
    """The endpoint, its retries and max tokens; each job brings its temperature and seed."""
    solved_at: float = 1.0
    _tasks: dict[str, tuple[Pack, Task]] = field(default_factory=dict, init=False, repr=False)
    _endpoint: EvalEndpoint | None = field(default=None, init=False, repr=False)

    def pool(self) -> list[GateTask]:
        """Every held-out task of every pack; SuiteMissing before any call is made."""
        found = [(p, t) for p in self.packs for t in eval_tasks(p)]
        self._tasks = {f"{p.name}/{t.id}": (p, t) for p, t in found}
        return [gate_task(p, t) for p, t in found]

    def __call__(self, client: aioredis.Redis):
        """One batch's job runner; the agent runtimes it makes share `client`."""
        runtimes: dict[str, AgentRuntime] = {}

        sink = TrajectorySink(client, stream=STREAM_EVAL_TRAJECTORIES)

        async def run(job: Job) -> Ran:
            pack, task = self._find(job.task)
            if pack.run is not None:
                return await self._team_run(sink, job, pack, task)
            if pack.name not in runtimes:
                runtimes[pack.name] = self._runtime(client, pack)
            return await self._run(runtimes[pack.name], job, pack, task)

        return run

    def _find(self, task: GateTask) -> tuple[Pack, Task]:
        if task.key not in self._tasks:
            self.pool()
        return self._tasks[task.key]

    async def _run(self, runtime: AgentRuntime, job: Job, pack: Pack, task: Task) -> Ran:
        policy = PolicyClient(replace(self.policy, temperature=job.temperature, seed=job.seed))
        version = job.version
        try:
            if job.form == FIRST_TURN:
                step = await runtime.first_call(task.agent, task.input, arm=version, policy=policy)
                _check_version([step], version)
                return self._first_turn(pack, task, step), None
            t = await runtime.run(
                task.agent,
                task.input,
                EVAL_USER,
                new_id("eval"),
                {"arloop.eval": version, "arloop.task": task.id, "arloop.form": job.form},
                arm=version,
                policy=policy,
            )
        except PolicyError as exc:
            raise EvalError(
                f"policy server failed while running {version} on {task.id}: {exc.reason}"
            ) from exc
        _check_version(t.model_steps, version)
        return outcome(pack, task, t, self.solved_at), t

    async def _team_run(self, sink: TrajectorySink, job: Job, pack: Pack, task: Task) -> Ran:
        """One task through the team's own `run`, its calls recorded by the endpoint."""
        if self._endpoint is None:
            self._endpoint = EvalEndpoint(self.policy)
        endpoint, version = self._endpoint, job.version
        base_url = await asyncio.to_thread(lambda: endpoint.base_url)
        run_id, recording = endpoint.open(version, job.temperature, job.seed)
        started = time.time()
        try:
            answer = await _call(pack, task, base_url, f"{MODEL}@{version}", {RUN_HEADER: run_id})
        except Exception as exc:
            if recording.failure is not None:
                raise EvalError(
                    f"policy server failed while running {version} on {task.id}: "
                    f"{recording.failure}"
                ) from exc
            raise TeamRunError(
                f"run() of pack {pack.name!r} failed on task {task.id} under {version}: "
                f"{type(exc).__name__}: {exc}"
            ) from exc
        finally:
            endpoint.close(run_id)
        if not recording.steps:
            raise TeamRunError(
                f"run() of pack {pack.name!r} answered task {task.id} without calling the "
                "base_url it was given: point the agent's client at base_url, model and headers"
            )
        metadata = {"arloop.eval": version, "arloop.task": task.id, "arloop.form": job.form}
        t = TrajectoryEvent(
            event_id=new_id("eval"),
            thread_id=run_id,
            agent=pack.name,
            user_id=EVAL_USER,
            input=task.input,
            output=str(answer or ""),
            policy_version=version,
            steps=recording.steps,
            status=RunStatus.OK,
            started_at=started,
            finished_at=time.time(),
            metadata=metadata | {"arloop.source": "chat_completions"},
        )
        _check_version(t.model_steps, version)
        await sink.write(t)
        return outcome(pack, task, t, self.solved_at), t

    def _first_turn(self, pack: Pack, task: Task, step: ModelStep) -> bool:
        try:
            return float(pack.first_turn(task, step)) >= self.solved_at
        except Exception as exc:
            raise VerifierError(
                f"first-turn check of {pack.name!r} failed on task {task.id}: {exc}"
            ) from exc

    def _runtime(self, client: aioredis.Redis, pack: Pack) -> AgentRuntime:
        return AgentRuntime(
            list(pack.agents),
            policy=PolicyClient(self.policy),
            threads=Threads(client, canary_share=0.0, ttl_s=3600),
            sink=TrajectorySink(client, stream=STREAM_EVAL_TRAJECTORIES),
        )


async def _call(pack: Pack, task: Task, base_url: str, model: str, headers: dict[str, str]):
    """The pack's `run` on one task: awaited if async, else in a worker thread."""
    assert pack.run is not None
    if inspect.iscoroutinefunction(pack.run):
        return await pack.run(task, base_url, model, dict(headers))
    return await asyncio.to_thread(pack.run, task, base_url, model, dict(headers))


def _check_version(steps: Sequence[ModelStep], version: str) -> None:
    served = {s.policy_version for s in steps}
    if served != {version}:
        raise EvalError(
            f"asked the policy server for {version}, it answered with {sorted(served)}: is it "
            "arloop's policy server?"
        )


def agent_suite(
    redis_url: str,
    packs: Sequence[Pack],
    policy: PolicyConfig,
    temperature: float,
    *,
    concurrency: int = 4,
    solved_at: float = 1.0,
    progress: Progress | None = None,
    redis_options: dict[str, Any] | None = None,
    connect: Callable[..., aioredis.Redis] | None = None,
) -> Suite:
    """The packs' held-out pools, run through the agent graph at `temperature`. A team's
    agent without an eval suite (`Pack.run`, no tasks or verifier) is learned from feedback
    alone: set aside, and named in every report."""
    unjudged = tuple(p.name for p in packs if _feedback_only(p))
    packs = [p for p in packs if p.name not in unjudged]
    agents = AgentRuns(list(packs), policy, solved_at)
    runs = EvalRuns(
        redis_url,
        agents,
        policy.max_tokens,
        concurrency,
        progress=progress,
        redis_options=redis_options or {},
        connect=connect,
    )
    return Suite("+".join(p.name for p in packs), agents.pool, runs, temperature, unjudged)


def _feedback_only(pack: Pack) -> bool:
    """A team's agent without held-out tasks or a verifier (a pool that fails to load is not:
    the suite then says why, `eval_tasks`)."""
    try:
        return pack.run is not None and not pack.has_eval_suite()
    except Exception:  # noqa: BLE001 -- the team's tasks(): reported by eval_tasks, not here
        return False


def gate_runner(
    s: LearnerSettings,
    redis_url: str,
    registry: PolicyRegistry,
    store: Store | None,
    packs: Sequence[Pack] | None = None,
    *,
    progress: Progress | None = None,
    looked: Looked | None = None,
) -> GateRunner:
    """The gate as `arloop learn` and `arloop eval` run it; SuiteMissing for an unknown pack,
    or for an endpoint that cannot run a pinned version (only arloop's policy server can)."""
    if not s.policy_config().names_versions:
        raise SuiteMissing(
            f"the eval gate runs pinned versions (arloop@v3) on arloop's policy server, but "
            f"ARLOOP_POLICY_MODEL={s.policy_model!r} is an endpoint of kind {s.policy_config().kind!r}: "
            "point the learner's ARLOOP_POLICY_MODEL and ARLOOP_POLICY_API_BASE at the policy "
            "server (openai/arloop), or ARLOOP_POLICY_PROVIDER=arloop if it serves another name"
        )
    if packs is None:
        size = s.tutoring_eval_size
        try:
            packs = [
                get_pack(ref, tutoring_source=s.tutoring_source, tutoring_eval_size=size)
                for ref in s.gate_packs()
            ]
        except PackNotFound as exc:
            raise SuiteMissing(str(exc)) from exc
    suite = agent_suite(
        redis_url,
        packs,
        s.policy_config(),
        s.sampling_temperature(),
        concurrency=s.eval_concurrency,
        solved_at=s.gate.solved_at,
        progress=progress,
        redis_options=s.redis_options(redis_url, asyncio=True),
        connect=functools.partial(s.async_redis, redis_url),
    )
    return GateRunner(
        registry,
        suite,
        s.gate,
        guards=s.guards,
        model_cache=s.model_cache,
        store=store,
        max_user_share=s.round.max_user_reward_share,
        looked=looked,
        canary=s.canary.enabled,
    )
