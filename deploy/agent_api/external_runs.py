"""Runs of agents arloop does not run itself: the `/v1/chat/completions` calls that share an
`X-Arloop-Run` (per tenant, owned by the API key that started it), kept in Redis call by call
and written as one `TrajectoryEvent` when the run closes, the schema the learner reads.

A run's life (`RunState`, moved only by `_CLOSE`, atomically): `open` while calls come; then
`ended` (`POST /v1/runs/{trajectory_id}/end` with the answer), `idle` (no call for
ARLOOP_RUN_IDLE_S: closed by whichever replica's sweeper sees it first) or `cancelled` (a
streamed call's client left: logged, never trained on). A closed run takes no more calls (409).
Its canary arm is drawn once, when it starts, as a thread's is (`agents.threads`). Each step is
scrubbed of PHI before it is kept; all of a run's keys share one hash tag (one cluster slot).
A call with `n` > 1 continues the run with its choice 0; the other choices are written at once
as one-step sibling trajectories (`siblings`, metadata `arloop.sibling_of`).
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import time
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import redis.asyncio as aioredis

from agents.events import (
    ONE_SHARD,
    POLICY_ALIASES,
    ModelStep,
    RunStatus,
    StreamShards,
    TrajectoryEvent,
    as_text,
    new_id,
)
from agents.threads import CANDIDATE
from agents.trajectory_sink import Scrub, TrajectorySink, scrub_messages, scrub_model_step
from deploy.agent_api.chat_wire import OpenAIError
from deploy.agent_api.metrics import ApiMetrics

log = logging.getLogger(__name__)
PREFIX = "arloop:ext"
OPEN_RUNS = f"{PREFIX}:open"
"""Sorted set: trajectory id of each open run -> the time of its last call (the sweeper's)."""
SIBLING_OF = "arloop.sibling_of"
"""Metadata of a trajectory that is another choice (`n` > 1) of a run's call: the run's id."""
KEEP_CLOSED_S = 24 * 3600
"""How long a closed run's record stays, so its run id is answered 409, not reopened."""


class RunState(StrEnum):
    OPEN = "open"
    ENDED = "ended"
    IDLE = "idle"
    CANCELLED = "cancelled"


TRANSITIONS = {RunState.OPEN: {RunState.ENDED, RunState.IDLE, RunState.CANCELLED}}
"""The only moves a run makes (closed states are final); `_CLOSE` enforces them."""

# KEYS: the client's run id. ARGV: a new trajectory id, ttl s. The run's trajectory id.
_RUN_ID = """
local t = redis.call('GET', KEYS[1])
if not t then t = ARGV[1] end
redis.call('SET', KEYS[1], t, 'EX', ARGV[2])
return t
"""
# KEYS: the run's record. ARGV: credential, user, agent, draw, canary share, has candidate (1/0),
# now, ttl s, thread id, metadata JSON. {outcome, arm or owner, call index}.
_BEGIN = """
local s = redis.call('HMGET', KEYS[1], 'credential', 'user', 'agent', 'state', 'arm')
if not s[1] then
  local arm = 'champion'
  if ARGV[6] == '1' and tonumber(ARGV[4]) < tonumber(ARGV[5]) then arm = 'candidate' end
  redis.call('HSET', KEYS[1], 'credential', ARGV[1], 'user', ARGV[2], 'agent', ARGV[3],
    'state', 'open', 'arm', arm, 'started_at', ARGV[7], 'last_at', ARGV[7], 'calls', 1,
    'inflight', 1, 'thread', ARGV[9], 'metadata', ARGV[10])
  redis.call('EXPIRE', KEYS[1], ARGV[8])
  return {'open', arm, '0'}
end
if s[1] ~= ARGV[1] then return {'key', '', ''} end
if s[2] ~= ARGV[2] then return {'user', '', ''} end
if s[3] ~= ARGV[3] then return {'agent', s[3], ''} end
if s[4] ~= 'open' then return {'closed', s[4], ''} end
local arm = s[5]
if arm == 'candidate' and ARGV[6] ~= '1' then
  arm = 'champion'
  redis.call('HSET', KEYS[1], 'arm', arm)
end
local n = redis.call('HINCRBY', KEYS[1], 'calls', 1) - 1
redis.call('HINCRBY', KEYS[1], 'inflight', 1)
redis.call('HSET', KEYS[1], 'last_at', ARGV[7])
redis.call('EXPIRE', KEYS[1], ARGV[8])
return {'open', arm, tostring(n)}
"""
# KEYS: the record, its steps. ARGV: call index, the step's JSON ('' for a failed call), now,
# ttl s.
_RECORD = """
if redis.call('HGET', KEYS[1], 'state') ~= 'open' then return 0 end
if ARGV[2] ~= '' then
  redis.call('HSET', KEYS[2], ARGV[1], ARGV[2])
  redis.call('EXPIRE', KEYS[2], ARGV[4])
end
redis.call('HINCRBY', KEYS[1], 'inflight', -1)
redis.call('HSET', KEYS[1], 'last_at', ARGV[3])
return 1
"""
# KEYS: the record. ARGV: new state, idle cutoff, credential ('' for any), now, stale cutoff.
_CLOSE = """
local s = redis.call('HMGET', KEYS[1], 'state', 'credential', 'last_at', 'inflight')
if not s[1] then return {'missing'} end
if ARGV[3] ~= '' and s[2] ~= ARGV[3] then return {'key'} end
if s[1] ~= 'open' then return {'closed', s[1]} end
local inflight = tonumber(s[4] or '0')
if ARGV[1] == 'idle' then
  if tonumber(s[3]) > tonumber(ARGV[2]) then return {'fresh'} end
  if inflight > 0 and tonumber(s[3]) > tonumber(ARGV[5]) then return {'busy'} end
elseif ARGV[1] == 'ended' and inflight > 0 then
  return {'busy'}
end
redis.call('HSET', KEYS[1], 'state', ARGV[1], 'closed_at', ARGV[4])
return {'ok'}
"""


@dataclass(frozen=True)
class Call:
    """One call of a run, admitted: where its step goes and which version arm serves it."""

    trajectory_id: str
    index: int
    arm: str
    user_id: str
    agent: str


class ExternalRuns:
    """The runs of other agents in Redis (see the module docstring)."""

    def __init__(
        self,
        client: aioredis.Redis,
        *,
        metrics: ApiMetrics,
        scrub: Scrub | None,
        idle_s: float,
        canary_share: float,
        lock_s: float,
        max_entries: int | None = None,
        rng: random.Random | None = None,
        scrub_prompts: bool = False,
        shards: StreamShards = ONE_SHARD,
    ) -> None:
        self.client, self.metrics, self.scrub = client, metrics, scrub
        self.scrub_prompts = scrub_prompts and scrub is not None
        """Calls' messages are scrubbed before the policy reads them (`prompt_of`), so a
        stored prompt's token ids stay its text's: the run trains like our own agents'."""
        self.idle_s, self.canary_share, self.lock_s = idle_s, canary_share, lock_s
        self.rng = rng or random.Random()
        # steps come scrubbed
        self.sink = TrajectorySink(client, None, max_entries=max_entries, shards=shards)
        self._run_id = client.register_script(_RUN_ID)
        self._begin = client.register_script(_BEGIN)
        self._record = client.register_script(_RECORD)
        self._close = client.register_script(_CLOSE)

    @property
    def ttl_s(self) -> int:
        return int(self.idle_s + self.lock_s + KEEP_CLOSED_S)

    async def begin(
        self,
        run_id: str | None,
        tenant: str,
        credential: str,
        user_id: str,
        agent: str,
        metadata: dict[str, str],
    ) -> Call:
        """Admit one call: a new run without `run_id` (or for a new one, whose trajectory gets
        `metadata`), else the next step of that run; 403 another key's run or another user's,
        409 a closed run or another agent."""
        trajectory_id = new_id("traj")
        if run_id is not None:
            trajectory_id = as_text(
                await self._run_id(
                    keys=[_run_key(tenant, run_id)], args=[trajectory_id, self.ttl_s]
                )
            )
        has_candidate = self.canary_share > 0 and await self.client.hexists(
            POLICY_ALIASES, CANDIDATE
        )
        now = time.time()
        args = [credential, user_id, agent, self.rng.random(), self.canary_share]
        args += [int(has_candidate), now, self.ttl_s, new_id("th"), json.dumps(metadata)]
        outcome, what, index = (
            as_text(v) for v in await self._begin(keys=[_record(trajectory_id)], args=args)
        )
        if outcome != "open":
            raise _refusal(outcome, what, run_id or trajectory_id)
        await self.client.zadd(OPEN_RUNS, {trajectory_id: now})
        return Call(trajectory_id, int(index), what, user_id, agent)

    async def record(self, call: Call, step: ModelStep | None) -> bool:
        """Keep a call's step (scrubbed), or note a call that failed (`None`); False when the
        run closed meanwhile (the step is dropped)."""
        data = ""
        if step is not None:
            if self.scrub is not None:  # CPU-heavy (presidio): off the event loop
                step = await asyncio.to_thread(self._scrubbed, step)
            data = step.model_dump_json()
        keys = [_record(call.trajectory_id), _steps(call.trajectory_id)]
        now = time.time()
        kept = await self._record(keys=keys, args=[call.index, data, now, self.ttl_s])
        await self.client.zadd(OPEN_RUNS, {call.trajectory_id: now})
        return bool(kept)

    async def siblings(self, call: Call, steps: dict[int, ModelStep]) -> list[TrajectoryEvent]:
        """Write the other choices of a call with `n` > 1 (choice index -> its step) as closed
        one-step trajectories beside the run, grouped by the learner by their prompt token ids
        (with the run for its first call); the run's feedback token judges none of them."""
        meta = as_text(await self.client.hget(_record(call.trajectory_id), "metadata") or "{}")
        now, written = time.time(), []
        for choice, step in sorted(steps.items()):
            if self.scrub is not None:
                step = await asyncio.to_thread(self._scrubbed, step)
            step = step.model_copy(update={"index": 0})
            metadata = json.loads(meta) | {
                "arloop.source": "chat_completions",
                SIBLING_OF: call.trajectory_id,
                "arloop.call": str(call.index),
                "arloop.choice": str(choice),
            }
            if not (step.prompt_token_ids and step.completion_token_ids):
                metadata["arloop.text_only"] = "true"
            event = TrajectoryEvent(
                event_id=new_id("traj"),
                thread_id=new_id("th"),  # a branch the conversation did not take
                agent=call.agent,
                user_id=call.user_id,
                input=_first_user_text([step]),
                output=step.output or "",
                policy_version=step.policy_version,
                steps=[step],
                status=RunStatus.OK,
                started_at=now - step.latency_ms / 1000,
                finished_at=now,
                metadata=metadata,
            )
            await self.sink.write(event)
            written.append(event)
        return written

    async def prompt_of(self, messages: list[dict[str, Any]]) -> list[dict[str, Any]] | None:
        """A call's messages as the policy is to read them: scrubbed of PHI when
        `scrub_prompts` (off the event loop), else None (sent as the client wrote them)."""
        if not self.scrub_prompts:
            return None
        assert self.scrub is not None
        return await asyncio.to_thread(scrub_messages, messages, self.scrub)

    def _scrubbed(self, step: ModelStep) -> ModelStep:
        assert self.scrub is not None
        return scrub_model_step(step, self.scrub, prompt=not self.scrub_prompts)

    async def trajectory_of(self, tenant: str, run_id: str) -> str:
        """The trajectory id of the run a client named `run_id` (its `X-Arloop-Run`), 404 if
        this tenant has no such run."""
        found = await self.client.get(_run_key(tenant, run_id))
        if found is None:
            raise OpenAIError(
                404,
                f"no run {run_id!r} here: name a run in X-Arloop-Run on its calls first",
                param="X-Arloop-Run",
                code="run_not_found",
            )
        return as_text(found)

    async def end(self, trajectory_id: str, credential: str, output: str) -> TrajectoryEvent:
        """Close a run with its final answer (404 unknown, 403 another key's, 409 closed or a
        call still in flight)."""
        return await self._closed(trajectory_id, RunState.ENDED, credential, output)

    async def cancel(self, call: Call, partial: ModelStep | None) -> None:
        """A streamed call's client left: its partial step kept, the run logged `cancelled`."""
        await self.record(call, partial)
        await self._closed(call.trajectory_id, RunState.CANCELLED, "", None)

    async def close_idle(self, now: float | None = None) -> int:
        """Close the runs with no call for `idle_s`; how many this replica closed."""
        now = time.time() if now is None else now
        due = await self.client.zrangebyscore(OPEN_RUNS, "-inf", now - self.idle_s, 0, 100)
        closed = 0
        for trajectory_id in map(as_text, due):
            try:
                await self._closed(trajectory_id, RunState.IDLE, "", None, now)
                closed += 1
            except OpenAIError as exc:  # closed elsewhere, or a call came: not this sweep's
                if exc.status != 409 or exc.code != "run_busy":
                    await self.client.zrem(OPEN_RUNS, trajectory_id)
        return closed

    async def _closed(
        self,
        trajectory_id: str,
        state: RunState,
        credential: str,
        output: str | None,
        now: float | None = None,
    ) -> TrajectoryEvent:
        now = time.time() if now is None else now
        args = [state.value, now - self.idle_s, credential, now, now - self.idle_s - self.lock_s]
        outcome = [as_text(v) for v in await self._close(keys=[_record(trajectory_id)], args=args)]
        if outcome[0] != "ok":
            raise _close_refusal(outcome, trajectory_id)
        event = await self._event(trajectory_id, state, output, now)
        await self.sink.write(event)
        await self.client.delete(_steps(trajectory_id))
        await self.client.expire(_record(trajectory_id), KEEP_CLOSED_S)
        await self.client.zrem(OPEN_RUNS, trajectory_id)
        self.metrics.observe_run(event)
        self.metrics.external_runs.labels(state.value).inc()
        if event.metadata.get("arloop.text_only") == "true":
            self.metrics.text_only_runs.labels(event.agent).inc()
        return event

    async def _event(
        self, trajectory_id: str, state: RunState, output: str | None, now: float
    ) -> TrajectoryEvent:
        """The run as the learner reads it: its steps in call order, renumbered."""
        record = {
            as_text(k): as_text(v)
            for k, v in (await self.client.hgetall(_record(trajectory_id))).items()
        }
        kept = await self.client.hgetall(_steps(trajectory_id))
        ordered = sorted(kept.items(), key=lambda kv: int(kv[0]))
        steps = [
            ModelStep.model_validate_json(raw).model_copy(update={"index": i})
            for i, (_, raw) in enumerate(ordered)
        ]
        if output is not None and self.scrub is not None:
            output = await asyncio.to_thread(self.scrub, output)
        last = steps[-1] if steps else None
        answer = output if output is not None else (last.output or "") if last else ""
        text_only = bool(steps) and not any(
            s.prompt_token_ids and s.completion_token_ids for s in steps
        )
        metadata = json.loads(record.get("metadata") or "{}") | {
            "arloop.source": "chat_completions",
            "arloop.closed_by": state.value,
        }
        if text_only:
            metadata["arloop.text_only"] = "true"
        return TrajectoryEvent(
            event_id=trajectory_id,
            thread_id=record.get("thread") or new_id("th"),
            agent=record.get("agent", ""),
            user_id=record.get("user", ""),
            input=_first_user_text(steps),
            output=answer,
            policy_version=last.policy_version if last else record.get("arm", ""),
            steps=steps,
            status=RunStatus.CANCELLED if state is RunState.CANCELLED else RunStatus.OK,
            started_at=float(record.get("started_at", now)),
            finished_at=now,
            metadata=metadata,
        )


async def close_idle_runs(runs: ExternalRuns) -> None:
    """The sweeper every replica runs: idle runs closed, a Redis outage outlived."""
    every = min(5.0, max(0.05, runs.idle_s / 4))
    while True:
        await asyncio.sleep(every)
        try:
            await runs.close_idle()
        except Exception as exc:  # noqa: BLE001 -- Redis down: the next sweep tries again
            log.warning("could not close idle runs: %s: %s", type(exc).__name__, exc)


def _run_key(tenant: str, run_id: str) -> str:
    """A client's run id -> its trajectory id, per tenant."""
    return f"{PREFIX}:run:{tenant}:{run_id}"


def _record(trajectory_id: str) -> str:
    return f"{PREFIX}:{{{trajectory_id}}}"


def _steps(trajectory_id: str) -> str:
    return f"{PREFIX}:{{{trajectory_id}}}:steps"


def _first_user_text(steps: list[ModelStep]) -> str:
    for step in steps:
        for message in step.messages:
            if message.get("role") == "user":
                content = message.get("content")
                return content if isinstance(content, str) else json.dumps(content)
    return ""


def _refusal(outcome: str, what: str, run: str) -> OpenAIError:
    if outcome == "key":
        return OpenAIError(
            403,
            f"run {run!r} was started by another API key: name your own run in X-Arloop-Run",
            param="X-Arloop-Run",
            code="run_forbidden",
        )
    if outcome == "user":
        return OpenAIError(
            403, f"run {run!r} belongs to another user", param="user", code="run_forbidden"
        )
    if outcome == "agent":
        return OpenAIError(
            409,
            f"run {run!r} is agent {what!r}'s: send its X-Arloop-Agent, or start another run",
            param="X-Arloop-Agent",
            code="run_agent",
        )
    return OpenAIError(
        409,
        f"run {run!r} is closed ({what}): it takes no more calls; start a new X-Arloop-Run",
        param="X-Arloop-Run",
        code="run_closed",
    )


def _close_refusal(outcome: list[str], trajectory_id: str) -> OpenAIError:
    if outcome[0] == "missing":
        return OpenAIError(404, f"no run {trajectory_id!r} here", code="run_not_found")
    if outcome[0] == "key":
        return OpenAIError(403, "this run was started by another API key", code="run_forbidden")
    if outcome[0] == "closed":
        return OpenAIError(
            409, f"run {trajectory_id!r} is already closed ({outcome[1]})", code="run_closed"
        )
    why = "a call came since" if outcome[0] == "fresh" else "a call of it is still in flight"
    return OpenAIError(409, f"run {trajectory_id!r} cannot close now: {why}", code="run_busy")
