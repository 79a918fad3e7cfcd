"""Reading logged runs back for people: pages of runs with their feedback, and one run whole.

The runs are the `arloop:trajectories` stream's entries (what the trajectory sink wrote,
PHI-scrubbed when the service scrubs), their feedback the `arloop:feedback` stream's: no
second store. With sharded streams, every shard's, merged (`stream_merge`). Pages go newest
first, by stream entry id (the cursor). Feedback always comes after its run, in its run's
shard, so the feedback of a batch of runs is read back from the newest feedback of their shard
down to the batch's oldest run, once per request. Every read is bounded: a filter that matches
little answers a short page with `next_cursor` rather than scanning the whole stream.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import redis.asyncio as aioredis

from agents.errors import ArloopError
from agents.events import (
    ONE_SHARD,
    AnswerPath,
    FeedbackEvent,
    FeedbackKind,
    ModelStep,
    RunStatus,
    StreamShards,
    TrajectoryEvent,
    as_text,
)
from deploy.agent_api.feedback_log import _decoded, parse_since
from deploy.agent_api.stream_merge import Merged, bounds_after, cursor_of, parse_cursor

Reads = Callable[[str], bool]
"""Whether the caller may read a stored user's runs (`deps.Caller.reads`)."""
RUN_BATCH = 100
RUN_BATCHES = 10
"""A request reads at most this many batches of runs (1,000 runs)."""
FEEDBACK_BATCH = 500
FEEDBACK_BATCHES = 40
"""...and at most this many batches of feedback (20,000 events): past it, `partial`."""
EXCERPT = 240
FEEDBACK_FILTERS = ("any", "none", "thumbs_up", "thumbs_down", "reviewed", "unreviewed")


@dataclass(frozen=True)
class RunFilter:
    """What a page of runs keeps (None: any)."""

    agent: str | None = None
    version: str | None = None
    status: str | None = None
    answered_by: str | None = None
    feedback: str | None = None

    def __post_init__(self) -> None:
        _one_of("status", self.status, [s.value for s in RunStatus])
        _one_of("answered_by", self.answered_by, [a.value for a in AnswerPath])
        _one_of("feedback", self.feedback, FEEDBACK_FILTERS)

    def keeps(self, run: TrajectoryEvent, feedback: list[FeedbackEvent]) -> bool:
        if self.agent and run.agent != self.agent:
            return False
        if self.version and run.policy_version != self.version:
            return False
        if self.status and run.status.value != self.status:
            return False
        if self.answered_by and run.answered_by.value != self.answered_by:
            return False
        return self.feedback is None or _feedback_matches(self.feedback, feedback)


def _one_of(name: str, value: str | None, allowed: Iterable[str]) -> None:
    allowed = list(allowed)
    if value is not None and value not in allowed:
        raise ArloopError(422, f"{name}={value[:40]!r} is not one of {', '.join(allowed)}")


def _feedback_matches(wanted: str, feedback: list[FeedbackEvent]) -> bool:
    thumbs = {f.value for f in feedback if f.kind is FeedbackKind.THUMBS}
    reviewed = any(f.kind is FeedbackKind.REVIEW for f in feedback)
    return {
        "any": bool(feedback),
        "none": not feedback,
        "thumbs_up": 1 in thumbs,
        "thumbs_down": -1 in thumbs,
        "reviewed": reviewed,
        "unreviewed": not reviewed,
    }[wanted]


@dataclass
class FeedbackIndex:
    """The feedback of recent runs by trajectory id, read newest first, each shard down to its
    floor."""

    shards: StreamShards = ONE_SHARD
    floors: dict[int, str] = field(default_factory=dict)
    """Per shard, the oldest feedback entry id read so far (exclusive next time); none yet:
    absent."""
    by_run: dict[str, list[FeedbackEvent]] = field(default_factory=lambda: defaultdict(list))
    read: int = 0
    partial: bool = False
    """The cap was met: runs older than their shard's floor may have feedback not shown."""

    async def down_to(self, client: aioredis.Redis, shard: int, oldest_run: str) -> None:
        """Read the feedback of `shard` newer than `oldest_run` not read yet (bounded)."""
        while not self.partial:
            floor = self.floors.get(shard)
            batch = await client.xrevrange(
                self.shards.feedback(shard),
                max="+" if floor is None else "(" + floor,
                min=oldest_run,
                count=FEEDBACK_BATCH,
            )
            for entry_id, fields in batch:
                self.floors[shard] = as_text(entry_id)
                event = _decoded(fields)
                if isinstance(event, FeedbackEvent):
                    self.by_run[event.trajectory_id].insert(0, event)  # oldest first
            self.read += len(batch)
            if len(batch) < FEEDBACK_BATCH:
                self.floors[shard] = oldest_run  # everything above it is read
                return
            self.partial = self.read >= FEEDBACK_BATCH * FEEDBACK_BATCHES

    def of(self, trajectory_id: str) -> list[FeedbackEvent]:
        return self.by_run.get(trajectory_id, [])


@dataclass
class Scan:
    """Runs read newest first (by entry id, then shard), with their feedback: what one request
    may read."""

    entries: Merged
    reads: Reads
    feedback: FeedbackIndex
    shards: StreamShards = ONE_SHARD
    last: str | None = None
    """The cursor of the last run read (the next page's)."""
    done: bool = False
    """Every shard's bottom (or `since`) was reached."""

    async def runs(self):
        """(cursor, run, its feedback) of the runs the caller reads, newest first: at most
        `RUN_BATCHES * RUN_BATCH` runs read."""
        for _ in range(0 if self.done else RUN_BATCHES * RUN_BATCH):
            entry = await self.entries.next()
            if entry is None:
                self.done = True
                return
            entry_id, shard, fields = entry
            self.last = cursor_of(entry_id, shard, self.shards)
            run = _decoded(fields)
            if isinstance(run, TrajectoryEvent) and self.reads(run.user_id):
                yield self.last, run, self.feedback.of(run.trajectory_id)


def scan(
    client: aioredis.Redis,
    reads: Reads,
    *,
    since: str | None = None,
    until: str | None = None,
    cursor: str | None = None,
    shards: StreamShards = ONE_SHARD,
) -> Scan:
    """A scan of every shard from `cursor` (exclusive) or `until` (exclusive) down to `since`."""
    tops = ["+"] * shards.count
    if cursor is not None:
        tops = bounds_after(cursor, shards)
    elif until is not None:
        tops = ["(" + parse_since(until)] * shards.count
    feedback = FeedbackIndex(shards)
    entries = Merged(
        client,
        shards.all_trajectories(),
        tops,
        parse_since(since),
        newest_first=True,
        batch=RUN_BATCH,
        on_read=lambda shard, oldest: feedback.down_to(client, shard, oldest),
    )
    return Scan(entries, reads, feedback, shards)


async def runs_page(
    client: aioredis.Redis,
    reads: Reads,
    keep: RunFilter,
    *,
    since: str | None,
    until: str | None,
    cursor: str | None,
    limit: int,
    shards: StreamShards = ONE_SHARD,
) -> dict[str, Any]:
    """Up to `limit` runs the caller reads that `keep` keeps, newest first, and where to go
    on (`next_cursor`: null at the streams' bottom)."""
    s = scan(client, reads, since=since, until=until, cursor=cursor, shards=shards)
    items = []
    async for entry_id, run, feedback in s.runs():
        if keep.keeps(run, feedback):
            items.append(summary(entry_id, run, feedback))
            if len(items) == limit:
                break
    return {
        "items": items,
        "next_cursor": None if s.done else s.last,
        "partial_feedback": s.feedback.partial,
    }


async def find_run(
    client: aioredis.Redis,
    reads: Reads,
    trajectory_id: str,
    cursor: str | None,
    shards: StreamShards = ONE_SHARD,
) -> tuple[str, TrajectoryEvent]:
    """(entry id, run), in the run's shard: at `cursor` when given (its list item's), else
    among its newest `RUN_BATCHES * RUN_BATCH` runs; 404 when not there or not the caller's to
    read."""
    stream = shards.trajectories(shards.of(trajectory_id))
    if cursor is not None:
        at, _ = parse_cursor(cursor, shards)
        found = await client.xrange(stream, min=at, max=at, count=1)
        candidates = [(as_text(i), _decoded(f)) for i, f in found]
    else:
        candidates = []
        top = "+"
        for _ in range(RUN_BATCHES):
            batch = await client.xrevrange(stream, max=top, count=RUN_BATCH)
            hit = [(as_text(i), f) for i, f in batch if _raw_id(f) == trajectory_id.encode()]
            candidates += [(i, _decoded(f)) for i, f in hit]
            if candidates or len(batch) < RUN_BATCH:
                break
            top = "(" + as_text(batch[-1][0])
    for entry_id, run in candidates:
        if isinstance(run, TrajectoryEvent) and run.trajectory_id == trajectory_id:
            if reads(run.user_id):
                return entry_id, run
    where = "at that cursor" if cursor else f"among the newest {RUN_BATCHES * RUN_BATCH} runs"
    raise ArloopError(
        404, f"no run {trajectory_id!r} of yours {where} (pass its list item's cursor)"
    )


def _raw_id(fields: dict) -> bytes:
    value = fields.get(b"event_id", fields.get("event_id", b""))
    return value if isinstance(value, bytes) else str(value).encode()


async def run_detail(
    client: aioredis.Redis,
    reads: Reads,
    trajectory_id: str,
    cursor: str | None,
    shards: StreamShards = ONE_SHARD,
) -> dict[str, Any]:
    """One run whole (`find_run`, `detail`) with its feedback, oldest first (read from the
    run's entry on in its shard, bounded)."""
    entry_id, run = await find_run(client, reads, trajectory_id, cursor, shards)
    shard = shards.of(trajectory_id)
    index = FeedbackIndex(shards)
    await index.down_to(client, shard, entry_id)
    feedback = [feedback_view(f) for f in index.of(trajectory_id)]
    return detail(cursor_of(entry_id, shard, shards), run, feedback)


def feedback_counts(feedback: list[FeedbackEvent]) -> dict[str, Any]:
    thumbs = [f.value for f in feedback if f.kind is FeedbackKind.THUMBS]
    return {
        "count": len(feedback),
        "thumbs_up": thumbs.count(1),
        "thumbs_down": thumbs.count(-1),
        "kinds": sorted({f.kind.value for f in feedback}),
        "reviewed": any(f.kind is FeedbackKind.REVIEW for f in feedback),
    }


def summary(cursor: str, run: TrajectoryEvent, feedback: list[FeedbackEvent]) -> dict:
    """A run as the list shows it: ids, outcome, excerpts, counts."""
    return {
        "cursor": cursor,
        "trajectory_id": run.trajectory_id,
        "thread_id": run.thread_id,
        "agent": run.agent,
        "user_id": run.user_id,
        "policy_version": run.policy_version,
        "status": run.status.value,
        "answered_by": run.answered_by.value,
        "started_at": run.started_at,
        "latency_ms": round((run.finished_at - run.started_at) * 1000, 1),
        "input": _excerpt(run.input),
        "output": _excerpt(run.output),
        "model_calls": len(run.model_steps),
        "tools": [s.name for s in run.tool_steps],
        "feedback": feedback_counts(feedback),
    }


def detail(cursor: str, run: TrajectoryEvent, feedback: list[dict]) -> dict:
    """A run whole, as stored (scrubbed): its steps, the guard's verdict, its feedback."""
    return {
        "cursor": cursor,
        "trajectory_id": run.trajectory_id,
        "thread_id": run.thread_id,
        "agent": run.agent,
        "task_kind": run.task_kind,
        "user_id": run.user_id,
        "policy_version": run.policy_version,
        "status": run.status.value,
        "started_at": run.started_at,
        "finished_at": run.finished_at,
        "input": run.input,
        "output": run.output,
        "guard": {
            "answered_by": run.answered_by.value,
            "model_output": run.model_output,
            "findings": {
                k.removeprefix("arloop."): v
                for k, v in sorted(run.metadata.items())
                if k.startswith("arloop.") and k != "arloop.credential"
            },
        },
        "metadata": {k: v for k, v in sorted(run.metadata.items()) if not k.startswith("arloop.")},
        "steps": [_step(s) for s in run.steps],
        "feedback": feedback,
    }


def feedback_view(f: FeedbackEvent) -> dict[str, Any]:
    return {
        "event_id": f.event_id,
        "kind": f.kind.value,
        "value": f.value,
        "text": f.text,
        "key": f.key,
        "reward": f.reward,
        "source": f.source,
        "user_id": f.user_id,
        "created_at": f.created_at,
    }


def _step(s) -> dict[str, Any]:
    if isinstance(s, ModelStep):
        return {
            "kind": "model",
            "index": s.index,
            "node": s.node,
            "model": s.model,
            "policy_version": s.policy_version,
            "prompt_messages": len(s.messages),
            "output": s.output,
            "tool_calls": [c.model_dump() for c in s.tool_calls],
            "finish_reason": s.finish_reason,
            "latency_ms": s.latency_ms,
        }
    return {
        "kind": "tool",
        "index": s.index,
        "call_id": s.call_id,
        "name": s.name,
        "arguments": s.arguments,
        "output": s.output,
        "error": s.error,
        "truncated": s.truncated,
        "latency_ms": s.latency_ms,
    }


def _excerpt(text: str) -> str:
    return text if len(text) <= EXCERPT else text[: EXCERPT - 1] + "…"
