"""Reading back what was logged: feedback pages, and (trajectory, feedback) joined as JSONL.

Both read the Redis streams (`arloop:feedback`, `arloop:trajectories`; every shard's, merged
by entry id: `stream_merge`) with XRANGE in bounded batches; a stream entry id (`<ms>-<seq>`,
with its shard when there are several) is the cursor. Streams hold what the learner has not
trimmed yet (it trims only below what it has acknowledged), so this is recent history.
"""

from __future__ import annotations

import json
import re
from collections import defaultdict
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime
from typing import Any

import redis.asyncio as aioredis

from agents.errors import ArloopError
from agents.events import (
    ONE_SHARD,
    EventDecodeError,
    FeedbackEvent,
    FeedbackKind,
    StreamShards,
    TrajectoryEvent,
    decode,
)
from deploy.agent_api.schemas import FeedbackItem, FeedbackPage
from deploy.agent_api.stream_merge import Merged, bounds_after, cursor_of

Sees = Callable[[str], bool]
"""Whether the caller may read a stored user's events (`deps.Caller.sees`)."""
BATCH = 500
SCAN_BATCHES = 10
"""A page reads at most this many batches: filters that match little return a short page
with `next_cursor` rather than scanning the whole stream in one request."""
SECONDS = r"^\d{1,10}(\.\d{1,6})?$"
"""`since` as seconds since the epoch."""
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_RFC3339 = re.compile(r"^\d{4}-\d{2}-\d{2}[Tt]\d{2}:\d{2}:\d{2}(\.\d{1,9})?([Zz]|[+-]\d{2}:\d{2})$")


def parse_since(value: str | None) -> str:
    """The first stream id at or after `since`: seconds since the epoch, or an RFC 3339 time
    (exactly the forms the OpenAPI schema declares; times before 1970 read as 1970)."""
    if value is None:
        return "-"
    if re.match(SECONDS, value):
        return f"{int(float(value) * 1000)}-0"
    try:
        float(value)
    except ValueError:
        pass
    else:
        raise ArloopError(
            422, f"since={value[:40]!r} is out of range: seconds since the epoch, as digits"
        )
    seconds = _rfc3339_seconds(value)
    if seconds is None:
        raise ArloopError(
            422,
            f"since={value[:40]!r} is neither seconds since the epoch nor an ISO 8601 "
            "(RFC 3339) time with its offset (e.g. 1767225600 or 2026-01-01T00:00:00Z)",
        )
    return f"{int(min(max(seconds, 0.0), 1e11) * 1000)}-0"


def _rfc3339_seconds(value: str) -> float | None:
    if not _RFC3339.match(value):
        return None
    text = value.upper().replace("Z", "+00:00")
    head, dot, rest = text.partition(".")  # Python reads at most 6 fractional digits
    if dot:
        digits = re.match(r"\d+", rest).group(0)
        text = f"{head}.{digits[:6].ljust(6, '0')}{rest[len(digits) :]}"
    try:
        return (datetime.fromisoformat(text) - _EPOCH).total_seconds()
    except ValueError:
        return None


def parse_kind(value: str | None) -> FeedbackKind | None:
    if value is None:
        return None
    try:
        return FeedbackKind(value)
    except ValueError:
        kinds = ", ".join(k.value for k in FeedbackKind)
        raise ArloopError(422, f"kind={value[:40]!r} is not one of {kinds}") from None


async def feedback_page(
    client: aioredis.Redis,
    *,
    sees: Sees,
    agent: str | None,
    since: str | None,
    kind: str | None,
    cursor: str | None,
    limit: int,
    shards: StreamShards = ONE_SHARD,
) -> FeedbackPage:
    """Up to `limit` feedback events the caller `sees` matching the filters, oldest first, and
    where to go on."""
    starts = (
        bounds_after(cursor, shards) if cursor is not None else [parse_since(since)] * shards.count
    )
    wanted = parse_kind(kind)
    entries = Merged(client, shards.all_feedback(), starts, "+", newest_first=False, batch=BATCH)
    items: list[FeedbackItem] = []
    last = None
    for _ in range(SCAN_BATCHES * BATCH):
        entry = await entries.next()
        if entry is None:
            return FeedbackPage(items=items, next_cursor=None)
        entry_id, shard, fields = entry
        last = cursor_of(entry_id, shard, shards)
        event = _decoded(fields)
        if not isinstance(event, FeedbackEvent) or not sees(event.user_id):
            continue
        if (wanted and event.kind is not wanted) or (agent and event.agent != agent):
            continue
        items.append(_item(last, event))
        if len(items) == limit:
            return FeedbackPage(items=items, next_cursor=last)
    return FeedbackPage(items=items, next_cursor=last)


async def export_jsonl(
    client: aioredis.Redis,
    *,
    sees: Sees,
    agent: str | None,
    since: str | None,
    rated_only: bool,
    shards: StreamShards = ONE_SHARD,
) -> AsyncIterator[str]:
    """One JSON line per run the caller `sees` since `since`, oldest first:
    `{"trajectory": {...}, "feedback": [...]}`.

    Feedback always comes after its run, so the feedback since `since` holds all there is on
    the runs since then; it is read first, then the runs, joined by trajectory id.
    """
    start = parse_since(since)
    feedback: dict[str, list[dict[str, Any]]] = defaultdict(list)
    async for event in _events(client, shards.all_feedback(), start):
        if isinstance(event, FeedbackEvent) and sees(event.user_id):
            feedback[event.trajectory_id].append(event.model_dump(mode="json"))
    async for event in _events(client, shards.all_trajectories(), start):
        if not isinstance(event, TrajectoryEvent) or not sees(event.user_id):
            continue
        if agent and event.agent != agent:
            continue
        mine = feedback.get(event.trajectory_id, [])
        if rated_only and not mine:
            continue
        line = {"trajectory": event.model_dump(mode="json"), "feedback": mine}
        yield json.dumps(line, separators=(",", ":")) + "\n"


async def _events(client: aioredis.Redis, streams: tuple[str, ...], start: str):
    """Every event of `streams` (one per shard) from `start` on, merged oldest first."""
    entries = Merged(client, streams, [start] * len(streams), "+", newest_first=False, batch=BATCH)
    while (entry := await entries.next()) is not None:
        yield _decoded(entry[2])


def _decoded(fields: dict) -> Any:
    try:
        return decode(fields)
    except EventDecodeError:  # a poison entry: the learner dead-letters it; skip it here
        return None


def _item(entry_id: str, e: FeedbackEvent) -> FeedbackItem:
    return FeedbackItem(
        cursor=entry_id,
        event_id=e.event_id,
        trajectory_id=e.trajectory_id,
        agent=e.agent,
        user_id=e.user_id,
        kind=e.kind.value,
        value=e.value,
        text=e.text,
        policy_version=e.policy_version,
        turn=e.turn,
        created_at=e.created_at,
        key=e.key,
        reward=e.reward,
    )
