"""Reading back what was logged: feedback pages, and (trajectory, feedback) joined as JSONL.

Both read the Redis streams (`arloop:feedback`, `arloop:trajectories`) with XRANGE in bounded
batches; a stream entry id (`<ms>-<seq>`) is the cursor. Streams hold what the learner has not
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
    STREAM_FEEDBACK,
    STREAM_TRAJECTORIES,
    EventDecodeError,
    FeedbackEvent,
    FeedbackKind,
    TrajectoryEvent,
    as_text,
    decode,
)
from deploy.agent_api.schemas import FeedbackItem, FeedbackPage

Sees = Callable[[str], bool]
"""Whether the caller may read a stored user's events (`deps.Caller.sees`)."""
BATCH = 500
SCAN_BATCHES = 10
"""A page reads at most this many batches: filters that match little return a short page
with `next_cursor` rather than scanning the whole stream in one request."""
CURSOR = r"^\d{1,19}-\d{1,19}$"
"""A stream entry id as the API hands it out (19 digits: below Redis's 2^64 bound)."""
SECONDS = r"^\d{1,10}(\.\d{1,6})?$"
"""`since` as seconds since the epoch."""
_ENTRY_ID = re.compile(CURSOR)
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


def parse_cursor(value: str) -> str:
    if not _ENTRY_ID.match(value):
        raise ArloopError(
            422, f"cursor={value[:40]!r} is not a stream entry id ('<ms>-<seq>', from next_cursor)"
        )
    return "(" + value


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
) -> FeedbackPage:
    """Up to `limit` feedback events the caller `sees` matching the filters, oldest first, and
    where to go on."""
    start = parse_cursor(cursor) if cursor is not None else parse_since(since)
    wanted = parse_kind(kind)
    items: list[FeedbackItem] = []
    for _ in range(SCAN_BATCHES):
        batch = await client.xrange(STREAM_FEEDBACK, min=start, count=BATCH)
        for entry_id, fields in batch:
            start = "(" + as_text(entry_id)
            event = _decoded(fields)
            if not isinstance(event, FeedbackEvent) or not sees(event.user_id):
                continue
            if (wanted and event.kind is not wanted) or (agent and event.agent != agent):
                continue
            items.append(_item(as_text(entry_id), event))
            if len(items) == limit:
                return FeedbackPage(items=items, next_cursor=as_text(entry_id))
        if len(batch) < BATCH:
            return FeedbackPage(items=items, next_cursor=None)
    return FeedbackPage(items=items, next_cursor=start[1:])


async def export_jsonl(
    client: aioredis.Redis,
    *,
    sees: Sees,
    agent: str | None,
    since: str | None,
    rated_only: bool,
) -> AsyncIterator[str]:
    """One JSON line per run the caller `sees` since `since`:
    `{"trajectory": {...}, "feedback": [...]}`.

    Feedback always comes after its run, so the feedback since `since` holds all there is on
    the runs since then; it is read first, then the runs, joined by trajectory id.
    """
    start = parse_since(since)
    feedback: dict[str, list[dict[str, Any]]] = defaultdict(list)
    async for _, event in _entries(client, STREAM_FEEDBACK, start):
        if isinstance(event, FeedbackEvent) and sees(event.user_id):
            feedback[event.trajectory_id].append(event.model_dump(mode="json"))
    async for _, event in _entries(client, STREAM_TRAJECTORIES, start):
        if not isinstance(event, TrajectoryEvent) or not sees(event.user_id):
            continue
        if agent and event.agent != agent:
            continue
        mine = feedback.get(event.trajectory_id, [])
        if rated_only and not mine:
            continue
        line = {"trajectory": event.model_dump(mode="json"), "feedback": mine}
        yield json.dumps(line, separators=(",", ":")) + "\n"


async def _entries(client: aioredis.Redis, stream: str, start: str):
    while True:
        batch = await client.xrange(stream, min=start, count=BATCH)
        for entry_id, fields in batch:
            yield as_text(entry_id), _decoded(fields)
        if len(batch) < BATCH:
            return
        start = "(" + as_text(batch[-1][0])


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
