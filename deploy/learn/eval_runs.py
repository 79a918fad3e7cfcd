"""The gate's eval runs: held-out tasks under one pinned version, in three forms, each outcome
cached under its version in Redis.

- first turn, sampled: the agent's first model call alone (`AgentRuntime.first_call`), scored
  by the pack's `first_turn`, at the serving temperature with k seeds per task: the cheap form
  the sequential test runs on;
- whole runs, sampled: the episode through the agent graph and its tools at the serving
  temperature, one seed per task: what users get, the report's figure, and the check that the
  first-turn form agrees with it;
- whole runs, greedy: for the guards (answer length, tool use) and, for the candidate, the
  logged tokens its KL and entropy are measured on.

Each run asks the policy server for the version by name (`arloop@v3`) with its own sampling
seed, so sample j of a task is drawn with the same seed for every version (coupled). A
version's weights never change, so its outcome on (form, temperature, seed, task) is computed
once and kept in a Redis hash per version (`EVAL_CACHE_PREFIX` + version): the champion's runs
are reused by every gate judged against it. Whole runs land on `arloop:eval:trajectories`,
which is never trained on. A policy server that fails, or answers with another version, is an
`EvalError`: the gate fails closed.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import redis.asyncio as aioredis

from agents.events import (
    EVAL_CACHE_PREFIX,
    STREAM_EVAL_TRAJECTORIES,
    ModelStep,
    TrajectoryEvent,
    new_id,
)
from agents.packs.base import Pack, Task
from agents.policy_client import PolicyClient, PolicyConfig, PolicyError
from agents.runtime import AgentRuntime
from agents.threads import Threads
from agents.trajectory_sink import TrajectorySink
from learner.gate.eval_gate import TaskOutcome
from learner.gate.evidence import answer_tokens

EVAL_USER = "arloop-eval"
SUITE, SERVER = "eval_suite", "policy_server"  # what a refusal names in `failed`
CACHE_TTL_S = 90 * 24 * 3600
FIRST_TURN, SAMPLED, GREEDY = "first_turn", "sampled", "greedy"

Progress = Callable[[str, int, int], None]
"""(what, done, total): called as eval runs finish."""


class EvalError(RuntimeError):
    """The suite could not be run (policy server down or erroring, wrong version served)."""

    failed = SERVER


class VerifierError(EvalError):
    """The pack's verifier crashed on a task: its scores cannot be trusted."""

    failed = SUITE


@dataclass(frozen=True)
class Item:
    """One held-out task of one pack."""

    pack: Pack
    task: Task

    @property
    def key(self) -> str:
        return f"{self.pack.name}/{self.task.id}"

    @property
    def stratum(self) -> str:
        return f"{self.pack.name}/{self.task.meta.get('kind', self.task.agent)}"


def outcome(item: Item, t: TrajectoryEvent, solved_at: float) -> TaskOutcome:
    """One whole run's result as the gate sees it: verifier score, tool use, answer length.

    The score is the model's own answer's (`model_answer`): a pack's envelope escalates every
    red flag whatever the version, so judging what the user got would hide the model."""
    pack, task = item.pack, item.task
    try:
        score = float(pack.verify(task, t.model_answer))
    except Exception as exc:
        raise VerifierError(f"verifier of {pack.name!r} failed on task {task.id}: {exc}") from exc
    used = task.needs_tool is not None and any(s.name == task.needs_tool for s in t.tool_steps)
    return TaskOutcome(
        task_id=item.key,
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
class EvalRuns:
    """Runs held-out tasks for one pinned version at a time (see the module's forms)."""

    redis_url: str
    policy: PolicyConfig
    """The endpoint, its retries and max tokens; the temperature of the sampled forms is
    passed per call (the serving temperature)."""
    concurrency: int = 4
    solved_at: float = 1.0
    progress: Progress | None = None
    redis_options: dict[str, Any] = field(default_factory=dict)
    """Credentials, TLS, health checks and retries of the Redis client (the settings')."""
    _kept: dict[str, TrajectoryEvent] = field(default_factory=dict, init=False, repr=False)
    """Whole runs this process made, by version and cache field: `keep` reuses them."""

    def first_turns(
        self,
        version: str,
        items: Sequence[Item],
        seeds: Sequence[Sequence[int]],
        temperature: float,
    ) -> list[list[int]]:
        """(tasks, k) 0/1: each task's first call under each of its seeds, scored."""
        jobs = [(item, seed) for item, row in zip(items, seeds, strict=True) for seed in row]
        flat = asyncio.run(self._all(version, FIRST_TURN, jobs, temperature, keep=False))
        out, at = [], 0
        for row in seeds:
            out.append([int(v) for v, _ in flat[at : at + len(row)]])
            at += len(row)
        return out

    def episodes(
        self,
        version: str,
        items: Sequence[Item],
        seeds: Sequence[int | None],
        temperature: float,
        *,
        keep: bool = False,
    ) -> tuple[list[TaskOutcome], list[TrajectoryEvent]]:
        """Whole runs (one seed per task; None and temperature 0: greedy). `keep`: each run's
        trajectory comes back too (made in this process, or run anew: Redis keeps outcomes only)."""
        form = GREEDY if temperature == 0 else SAMPLED  # per job: one without a seed is greedy
        done = asyncio.run(
            self._all(version, form, list(zip(items, seeds, strict=True)), temperature, keep)
        )
        return [o for o, _ in done], [t for _, t in done if t is not None]

    # -- one batch of runs -------------------------------------------------------------------

    async def _all(self, version, form, jobs, temperature, keep):
        """Each job's result; jobs with the same cache field (a greedy agent's k samples)
        run once."""
        client = aioredis.from_url(
            self.redis_url,
            **(self.redis_options | {"socket_connect_timeout": 30, "socket_timeout": 60}),
        )
        try:
            key = EVAL_CACHE_PREFIX + version
            # a job without a seed is greedy (an agent that samples greedily, or temperature 0)
            fields = [_field(form, temperature, seed, self.policy, item) for item, seed in jobs]
            first = {f: i for i, f in reversed(list(enumerate(fields)))}  # field -> first job
            unique = sorted(first.values())
            cached = dict.fromkeys(unique)
            if unique and not keep:
                got = await client.hmget(key, [fields[i] for i in unique])
                cached = dict(zip(unique, got, strict=True))
            kept = {i: self._kept.get(f"{version}|{fields[i]}") if keep else None for i in unique}
            runtimes = {}
            gate, done = asyncio.Semaphore(self.concurrency), 0
            total = sum(1 for i in unique if cached[i] is None and kept[i] is None)

            async def one(i: int):
                nonlocal done
                item, seed = jobs[i]
                if cached[i] is not None:
                    return _load(form, cached[i]), None
                if kept[i] is not None:
                    return outcome(item, kept[i], self.solved_at), kept[i]
                if item.pack.name not in runtimes:
                    runtimes[item.pack.name] = self._runtime(client, item.pack)
                how = _greedy(form, temperature, seed)
                async with gate:
                    result = await self._run(runtimes[item.pack.name], *how, item, seed, version)
                await client.hset(key, fields[i], _dump(form, result[0]))
                if result[1] is not None:
                    self._kept[f"{version}|{fields[i]}"] = result[1]
                done += 1
                if self.progress:
                    self.progress(f"{version} {form.replace('_', ' ')}", done, total)
                return result

            results = dict(
                zip(unique, await asyncio.gather(*(one(i) for i in unique)), strict=True)
            )
            await client.expire(key, CACHE_TTL_S)
            return [results[first[f]] for f in fields]
        finally:
            await client.aclose()

    async def _run(self, runtime: AgentRuntime, form: str, temperature, item: Item, seed, version):
        policy = PolicyClient(replace(self.policy, temperature=temperature, seed=seed))
        try:
            if form == FIRST_TURN:
                step = await runtime.first_call(
                    item.task.agent, item.task.input, arm=version, policy=policy
                )
                _check_version([step], version)
                return self._first_turn(item, step), None
            t = await runtime.run(
                item.task.agent,
                item.task.input,
                EVAL_USER,
                new_id("eval"),
                {"arloop.eval": version, "arloop.task": item.task.id, "arloop.form": form},
                arm=version,
                policy=policy,
            )
        except PolicyError as exc:
            raise EvalError(
                f"policy server failed while running {version} on {item.task.id}: {exc.reason}"
            ) from exc
        _check_version(t.model_steps, version)
        return outcome(item, t, self.solved_at), t

    def _first_turn(self, item: Item, step: ModelStep) -> bool:
        try:
            return float(item.pack.first_turn(item.task, step)) >= self.solved_at
        except Exception as exc:
            raise VerifierError(
                f"first-turn check of {item.pack.name!r} failed on task {item.task.id}: {exc}"
            ) from exc

    def _runtime(self, client: aioredis.Redis, pack: Pack) -> AgentRuntime:
        return AgentRuntime(
            list(pack.agents),
            policy=PolicyClient(self.policy),
            threads=Threads(client, canary_share=0.0, ttl_s=3600),
            sink=TrajectorySink(client, stream=STREAM_EVAL_TRAJECTORIES),
        )


def _check_version(steps: Sequence[ModelStep], version: str) -> None:
    served = {s.policy_version for s in steps}
    if served != {version}:
        raise EvalError(
            f"asked the policy server for {version}, it answered with {sorted(served)}: is it "
            "arloop's policy server?"
        )


def _greedy(form: str, temperature: float, seed: int | None) -> tuple[str, float]:
    """(form, temperature) a job runs at: without a seed it is greedy."""
    if seed is None:
        return (GREEDY if form == SAMPLED else form), 0.0
    return form, temperature


def _field(
    form: str, temperature: float, seed: int | None, policy: PolicyConfig, item: Item
) -> str:
    form, temperature = _greedy(form, temperature, seed)
    return f"{form}|t={temperature:g}|max={policy.max_tokens}|seed={seed}|{item.key}"


def _dump(form: str, value) -> str:
    return str(int(value)) if form == FIRST_TURN else json.dumps(asdict(value))


def _load(form: str, raw: bytes | str):
    text = raw.decode() if isinstance(raw, bytes) else raw
    return bool(int(text)) if form == FIRST_TURN else TaskOutcome(**json.loads(text))
