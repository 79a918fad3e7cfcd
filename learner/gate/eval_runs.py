"""The gate's eval runs: held-out tasks under one pinned version, in three forms, each outcome
cached under its version in Redis.

- first turn, sampled: the agent's first model call alone, scored by the pack's `first_turn`,
  at the serving temperature with k seeds per task: the cheap form the sequential test runs on;
- whole runs, sampled: the episode through the agent graph and its tools at the serving
  temperature, one seed per task: what users get, the report's figure, and the check that the
  first-turn form agrees with it;
- whole runs, greedy: for the guards (answer length, tool use) and, for the candidate, the
  logged tokens its KL and entropy are measured on.

The learner has no agents: the process that has them hands in a `Runner`, which runs one
`Job` (a plain `GateTask` under a version, form, temperature and seed) and says how it went
(`deploy/learn/agent_runs.py` runs it through the agent graph). This module does the rest:
batches, concurrency and the cache. Sample j of a task is drawn with the same seed for every
version (coupled). A version's weights never change, so its outcome on (form, temperature,
seed, task) is computed once and kept in a Redis hash per version (`EVAL_CACHE_PREFIX` +
version): the champion's runs are reused by every gate judged against it. A failed run is an
`EvalError`: the gate fails closed.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import redis.asyncio as aioredis

from agents.events import EVAL_CACHE_PREFIX, TrajectoryEvent, as_text
from learner.gate.eval_gate import TaskOutcome

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
class GateTask:
    """One held-out task as the gate sees it: plain data, the agent stays with the runner."""

    key: str
    """`pack/task id`: the cache field's tail and the outcome's `task_id`."""
    stratum: str
    """`pack/kind`: the draw is stratified on it."""
    first_turn: bool = False
    """The pack scores the agent's first call alone (the cheap form of the sequential test)."""
    samples: bool = True
    """The task's agent samples (its own temperature, if it sets one, is above 0)."""


@dataclass(frozen=True)
class Job:
    """One eval run: a task under a pinned version, in one form (GREEDY: temperature 0)."""

    version: str
    form: str
    temperature: float
    seed: int | None
    task: GateTask


Ran = tuple[Any, TrajectoryEvent | None]
"""FIRST_TURN: (solved: bool, None); whole runs: (TaskOutcome, the run's trajectory)."""
Runner = Callable[[aioredis.Redis], Callable[[Job], Awaitable[Ran]]]
"""Given a batch's Redis client, the coroutine function that runs one job (what it builds to
run them, agents and their sinks, shares that client); raises EvalError when it cannot."""


@dataclass
class EvalRuns:
    """Runs held-out tasks for one pinned version at a time (see the module's forms)."""

    redis_url: str
    run: Runner
    max_tokens: int | None = None
    """The endpoint's answer cap: runs under another cap are other runs (part of the cache key)."""
    concurrency: int = 4
    progress: Progress | None = None
    redis_options: dict[str, Any] = field(default_factory=dict)
    """Credentials, TLS, health checks and retries of the Redis client (the settings')."""
    connect: Callable[..., aioredis.Redis] | None = None
    """Builds the Redis client from keyword arguments (the settings' own: a cluster client
    where they say so); None: a plain client on `redis_url` with `redis_options`."""
    _kept: dict[str, Ran] = field(default_factory=dict, init=False, repr=False)
    """Whole runs this process made, by version and cache field: `keep` reuses them."""

    def first_turns(
        self,
        version: str,
        tasks: Sequence[GateTask],
        seeds: Sequence[Sequence[int]],
        temperature: float,
    ) -> list[list[int]]:
        """(tasks, k) 0/1: each task's first call under each of its seeds, scored."""
        jobs = [(task, seed) for task, row in zip(tasks, seeds, strict=True) for seed in row]
        flat = asyncio.run(self._all(version, FIRST_TURN, jobs, temperature, keep=False))
        out, at = [], 0
        for row in seeds:
            out.append([int(v) for v, _ in flat[at : at + len(row)]])
            at += len(row)
        return out

    def episodes(
        self,
        version: str,
        tasks: Sequence[GateTask],
        seeds: Sequence[int | None],
        temperature: float,
        *,
        keep: bool = False,
    ) -> tuple[list[TaskOutcome], list[TrajectoryEvent]]:
        """Whole runs (one seed per task; None and temperature 0: greedy). `keep`: each run's
        trajectory comes back too (made in this process, or run anew: Redis keeps outcomes only)."""
        form = GREEDY if temperature == 0 else SAMPLED  # per job: one without a seed is greedy
        done = asyncio.run(
            self._all(version, form, list(zip(tasks, seeds, strict=True)), temperature, keep)
        )
        return [o for o, _ in done], [t for _, t in done if t is not None]

    # -- one batch of runs -------------------------------------------------------------------

    async def _all(self, version, form, jobs, temperature, keep):
        """Each job's result; jobs with the same cache field (a greedy agent's k samples)
        run once."""
        timeouts = {"socket_connect_timeout": 30, "socket_timeout": 60}
        if self.connect is not None:
            client = self.connect(**timeouts)
        else:
            client = aioredis.from_url(self.redis_url, **(self.redis_options | timeouts))
        try:
            key = EVAL_CACHE_PREFIX + version
            # a job without a seed is greedy (an agent that samples greedily, or temperature 0)
            fields = [self._field(form, temperature, seed, task) for task, seed in jobs]
            first = {f: i for i, f in reversed(list(enumerate(fields)))}  # field -> first job
            unique = sorted(first.values())
            cached = dict.fromkeys(unique)
            if unique and not keep:
                got = await client.hmget(key, [fields[i] for i in unique])
                cached = dict(zip(unique, got, strict=True))
            kept = {i: self._kept.get(f"{version}|{fields[i]}") if keep else None for i in unique}
            run_one = self.run(client)
            gate, done = asyncio.Semaphore(self.concurrency), 0
            total = sum(1 for i in unique if cached[i] is None and kept[i] is None)

            async def one(i: int) -> Ran:
                nonlocal done
                task, seed = jobs[i]
                if cached[i] is not None:
                    return _load(form, cached[i]), None
                if kept[i] is not None:
                    return kept[i]
                how, t = _greedy(form, temperature, seed)
                async with gate:
                    result = await run_one(Job(version, how, t, seed, task))
                await client.hset(key, fields[i], _dump(form, result[0]))
                if result[1] is not None:
                    self._kept[f"{version}|{fields[i]}"] = result
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

    def _field(self, form: str, temperature: float, seed: int | None, task: GateTask) -> str:
        form, temperature = _greedy(form, temperature, seed)
        return f"{form}|t={temperature:g}|max={self.max_tokens}|seed={seed}|{task.key}"


def _greedy(form: str, temperature: float, seed: int | None) -> tuple[str, float]:
    """(form, temperature) a job runs at: without a seed it is greedy."""
    if seed is None:
        return (GREEDY if form == SAMPLED else form), 0.0
    return form, temperature


def _dump(form: str, value) -> str:
    return str(int(value)) if form == FIRST_TURN else json.dumps(asdict(value))


def _load(form: str, raw: bytes | str):
    text = as_text(raw)
    return bool(int(text)) if form == FIRST_TURN else TaskOutcome(**json.loads(text))
