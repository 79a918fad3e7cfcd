"""How far the learner is behind the streams: length, lag, pending and dead letters.

Read straight from Redis (XINFO, XRANGE, XLEN: Redis 6.2 commands), so the agent API's
dashboard sees a learner that has stopped reading, and the learner exports the same figures
on its /metrics. Redis 6.2's XINFO GROUPS has no `lag`: the entries after the group's
last-delivered id are counted with XRANGE, up to `LAG_CAP`.

Retention (`ARLOOP_STREAM_MAX_ENTRIES`, XADD MAXLEN ~) drops the oldest entries whether the
learner read them or not. Entries it never read are counted on Redis 7 and later from the
stream's `entries-added` and the group's `entries-read`, while the stream's first entry lies
past the group's last-delivered id (after that, the learner has read on and the gap is
history: the learner logs it when it sees it). Redis 6.2 keeps neither counter: None there.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import Any

import redis

from agents.events import LEARNER_GROUP, ONE_SHARD, StreamShards, as_text

LAG_CAP = 100
"""Undelivered entries counted at most: XRANGE returns whole entries (a run can be tens of
kilobytes), so a larger lag reads as this with `lag_capped` set, beside the age of the oldest."""


@dataclass(frozen=True)
class StreamStats:
    """One stream as the learner's consumer group sees it."""

    stream: str
    length: int
    lag: int  # entries not yet delivered to the group
    lag_capped: bool
    lag_seconds: float  # age of the oldest undelivered entry (0 when none)
    pending: int  # delivered, not yet acknowledged
    group: bool  # the learner's group exists (a learner has started once)
    trimmed_unread: int | None = None  # entries dropped before the learner read them (Redis 7+)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def stream_stats(client: redis.Redis, stream: str, now: float | None = None) -> StreamStats:
    """The figures of one stream (zeros for a stream that does not exist yet)."""
    now = time.time() if now is None else now
    if not client.exists(stream):
        return StreamStats(stream, 0, 0, False, 0.0, 0, False)
    length = int(client.xlen(stream))
    group = next(
        (g for g in client.xinfo_groups(stream) if as_text(g["name"]) == LEARNER_GROUP), None
    )
    last = as_text(group["last-delivered-id"]) if group else "0-0"
    undelivered = client.xrange(stream, min=f"({last}", count=LAG_CAP + 1)
    lag = min(len(undelivered), LAG_CAP)
    oldest = _ms(as_text(undelivered[0][0])) / 1000 if undelivered else now
    return StreamStats(
        stream=stream,
        length=length,
        lag=lag,
        lag_capped=len(undelivered) > LAG_CAP,
        lag_seconds=max(0.0, now - oldest),
        pending=int(group["pending"]) if group else 0,
        group=group is not None,
        trimmed_unread=_trimmed_unread(client, stream, group, length, last),
    )


def _trimmed_unread(
    client: redis.Redis, stream: str, group: dict | None, length: int, last: str
) -> int | None:
    """Entries the group never read that are gone from the stream (see the module docstring);
    None where Redis keeps no counters (6.2) or no learner has started."""
    if group is None or "entries-read" not in group:
        return None
    first = client.xrange(stream, count=1)
    if not first or _key(as_text(first[0][0])) <= _key(last):
        return 0  # the stream still starts at or before what the group read: no gap now
    read = int(group["entries-read"] or 0)  # nil until the group has read anything
    return max(0, int(client.xinfo_stream(stream)["entries-added"]) - read - length)


def all_stats(client: redis.Redis, shards: StreamShards = ONE_SHARD) -> dict[str, Any]:
    """Every shard's trajectory and feedback streams' figures and the dead letters of all
    shards, as JSON-ready values."""
    now = time.time()
    streams = (*shards.all_trajectories(), *shards.all_feedback())
    return {
        "streams": [stream_stats(client, s, now).to_dict() for s in streams],
        "dead_letters": sum(int(client.xlen(s)) for s in shards.all_dead()),
        "at": now,
    }


def _key(entry_id: str) -> tuple[int, int]:
    ms, _, seq = entry_id.partition("-")
    return int(ms), int(seq or 0)


def _ms(entry_id: str) -> int:
    return int(entry_id.split("-", 1)[0])
