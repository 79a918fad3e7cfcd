"""Reads trajectories and feedback from Redis Streams into the store: persist first, then XACK.

At-least-once from Redis, exactly-once into the store: entries are read with XREADGROUP (group
`learner`), written to SQLite in one transaction (INSERT OR IGNORE by event_id), and only then
acknowledged. A crash before the commit leaves them pending in Redis; a crash after it leaves a
pending entry whose re-delivery is a no-op. Pending entries of a dead consumer are taken over
with XAUTOCLAIM; entries delivered too often, or that do not decode, go to the dead-letter
stream of their shard (`arloop:dead` unsharded).

With sharded streams (`StreamShards`) the group reads every shard's two streams. The ledger is
the store's, by event id: an event id is a function of its run's id, and so of its shard, so
each shard's events are counted once whatever order the shards are read in.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

import redis

from agents.events import (
    FORGET_REQUESTS,
    LEARNER_GROUP,
    ONE_SHARD,
    EventDecodeError,
    FeedbackEvent,
    StreamShards,
    TrajectoryEvent,
    as_text,
    decode,
    is_cluster,
)
from learner.crashpoints import crash_point
from learner.store import Store

log = logging.getLogger(__name__)

Event = TrajectoryEvent | FeedbackEvent
_DROP_REQUEST = """
if redis.call('HGET', KEYS[1], ARGV[1]) == ARGV[2] then return redis.call('HDEL', KEYS[1], ARGV[1]) end
return 0
"""


@dataclass(frozen=True)
class Entry:
    stream: str
    entry_id: str
    fields: dict[bytes, bytes]
    deliveries: int = 1


@dataclass(frozen=True)
class DeadLetter:
    stream: str
    entry_id: str
    reason: str


@dataclass
class PollResult:
    """What one poll did; `caught_up` when it reached the end of both streams."""

    read: int = 0
    new: int = 0
    duplicates: int = 0
    dead: list[DeadLetter] = field(default_factory=list)
    caught_up: bool = False


class TrajectorySource:
    """The learner's consumer on both streams; `poll()` moves one batch from Redis to the store."""

    def __init__(
        self,
        client: redis.Redis,
        store: Store,
        consumer: str,
        *,
        max_deliveries: int = 5,
        claim_idle_ms: int = 60_000,
        block_ms: int = 1000,
        count: int = 256,
        shards: StreamShards = ONE_SHARD,
    ) -> None:
        self.r, self.store, self.consumer = client, store, consumer
        self.shards = shards
        self.streams = shards.all_trajectories() + shards.all_feedback()
        self._expected: dict[str, type[Event]] = {
            **{s: TrajectoryEvent for s in shards.all_trajectories()},
            **{s: FeedbackEvent for s in shards.all_feedback()},
        }
        self.max_deliveries, self.claim_idle_ms = max_deliveries, claim_idle_ms
        self.block_ms, self.count = block_ms, count
        self._own_pending_done = False  # our PEL from a previous life is re-read first
        self._claim_cursor = {s: "0-0" for s in self.streams}
        self._drop_request = client.register_script(_DROP_REQUEST)
        self.dead_total = 0

    def ensure_groups(self) -> None:
        """Create the consumer group on every stream (from the start, creating the streams)."""
        for stream in self.streams:
            try:
                self.r.xgroup_create(stream, LEARNER_GROUP, id="0", mkstream=True)
            except redis.ResponseError as exc:
                if "BUSYGROUP" not in str(exc):
                    raise

    def poll(self) -> PollResult:
        """Read one batch (own pending, reclaimed, then new), persist it, then acknowledge it."""
        entries, caught_up = self._read()
        result = PollResult(read=len(entries), caught_up=caught_up)
        if not entries:
            return result
        crash_point("after_read")
        gone = [e for e in entries if not e.fields]  # deleted from the stream while pending
        good, dead = self._sort(self._with_deliveries([e for e in entries if e.fields]))
        result.new = self.store.add_events([event for _, event in good])
        result.duplicates = len(good) - result.new
        crash_point("after_persist")
        self._ack([e for e, _ in good] + gone)
        for entry, reason in dead:
            self._dead_letter(entry, reason)
            result.dead.append(DeadLetter(entry.stream, entry.entry_id, reason))
        self.dead_total += len(result.dead)
        return result

    # -- reading ---------------------------------------------------------------------------

    def _read(self) -> tuple[list[Entry], bool]:
        """(entries, caught_up): caught up when a read of new entries came back short."""
        if not self._own_pending_done:
            entries = self._readgroup({s: "0" for s in self.streams}, block=None)
            if entries:
                return entries, False
            self._own_pending_done = True
        entries = self._reclaim()
        if entries:
            return entries, False
        entries = self._readgroup({s: ">" for s in self.streams}, block=self.block_ms)
        per_stream = [sum(e.stream == s for e in entries) for s in self.streams]
        return entries, all(n < self.count for n in per_stream)

    def _readgroup(self, streams: dict[str, str], block: int | None) -> list[Entry]:
        if is_cluster(self.r):  # the streams live in other slots: one read each, the last blocks
            entries: list[Entry] = []
            for i, (stream, start) in enumerate(streams.items()):
                last = i == len(streams) - 1
                entries += self._readgroup_one(
                    {stream: start}, None if entries or not last else block
                )
            return entries
        return self._readgroup_one(streams, block)

    def _readgroup_one(self, streams: dict[str, str], block: int | None) -> list[Entry]:
        reply = self.r.xreadgroup(
            LEARNER_GROUP, self.consumer, streams, count=self.count, block=block
        )
        return [
            Entry(as_text(stream), as_text(entry_id), fields or {})
            for stream, items in (reply or [])
            for entry_id, fields in items
        ]

    def _reclaim(self) -> list[Entry]:
        """Take over entries another consumer left pending longer than claim_idle_ms."""
        out: list[Entry] = []
        for stream in self.streams:
            reply = self.r.xautoclaim(
                stream,
                LEARNER_GROUP,
                self.consumer,
                self.claim_idle_ms,
                start_id=self._claim_cursor[stream],
                count=self.count,
            )
            self._claim_cursor[stream] = as_text(reply[0])
            out += [Entry(stream, as_text(i), f or {}) for i, f in reply[1] if i is not None]
        if out:
            log.info("reclaimed %d stale pending entries", len(out))
        return out

    def _with_deliveries(self, entries: list[Entry]) -> list[Entry]:
        """The same entries with their delivery counts from XPENDING."""
        counts: dict[tuple[str, str], int] = {}
        for stream in {e.stream for e in entries}:
            ids = sorted((e.entry_id for e in entries if e.stream == stream), key=_id_key)
            pel = self.r.xpending_range(
                stream, LEARNER_GROUP, ids[0], ids[-1], len(ids) + 1000, consumername=self.consumer
            )
            for p in pel:
                counts[(stream, as_text(p["message_id"]))] = int(p["times_delivered"])
        return [
            Entry(e.stream, e.entry_id, e.fields, counts.get((e.stream, e.entry_id), 1))
            for e in entries
        ]

    # -- sorting, acking, dead letters -----------------------------------------------------

    def _sort(
        self, entries: list[Entry]
    ) -> tuple[list[tuple[Entry, Event]], list[tuple[Entry, str]]]:
        """(entries that hold a valid event of their stream, entries to dead-letter with why)."""
        good: list[tuple[Entry, Event]] = []
        dead: list[tuple[Entry, str]] = []
        for entry in entries:
            try:
                good.append((entry, self._check(entry)))
            except EventDecodeError as exc:
                dead.append((entry, str(exc)))
        return good, dead

    def _check(self, entry: Entry) -> Event:
        if entry.deliveries > self.max_deliveries:
            raise EventDecodeError(
                f"delivered {entry.deliveries} times without being persisted "
                f"(max_deliveries={self.max_deliveries})"
            )
        event = decode(entry.fields)
        expected = self._expected[entry.stream]
        if not isinstance(event, expected):
            raise EventDecodeError(f"a {type(event).__name__} does not belong on {entry.stream}")
        return event

    def _ack(self, entries: list[Entry]) -> None:
        pipe = self.r.pipeline(transaction=False)
        for stream in {e.stream for e in entries}:
            pipe.xack(stream, LEARNER_GROUP, *[e.entry_id for e in entries if e.stream == stream])
        pipe.execute()

    def _dead_letter(self, entry: Entry, reason: str) -> None:
        """Copy the entry with why it died to its shard's dead-letter stream and ack it,
        atomically."""
        log.warning("dead letter %s %s: %s", entry.stream, entry.entry_id, reason)
        fields = {
            **entry.fields,
            "dead_reason": reason,
            "dead_stream": entry.stream,
            "dead_id": entry.entry_id,
            "dead_deliveries": str(entry.deliveries),
            "dead_at": f"{time.time():.3f}",
        }
        dead = self.shards.dead(self.shards.shard_of_stream(entry.stream))
        if is_cluster(self.r):  # the dead-letter stream is in another slot: copy, then ack (a
            self.r.xadd(dead, fields)  # crash between leaves the entry pending, to be
            self.r.xack(entry.stream, LEARNER_GROUP, entry.entry_id)  # copied again, same dead_id)
            return
        pipe = self.r.pipeline(transaction=True)
        pipe.xadd(dead, fields)
        pipe.xack(entry.stream, LEARNER_GROUP, entry.entry_id)
        pipe.execute()

    # -- housekeeping ----------------------------------------------------------------------

    def forget(self) -> int:
        """Erase from the store the users whose erasure was asked (`agents.erasure`), then drop
        each request unless it was asked again meanwhile; the rows deleted."""
        asked = self.r.hgetall(FORGET_REQUESTS)
        if not asked:
            return 0
        deleted = self.store.forget_users([as_text(user) for user in asked])
        for user, when in asked.items():
            self._drop_request(keys=[FORGET_REQUESTS], args=[user, when])
        return deleted

    def pending(self) -> int:
        """Entries delivered to the group and not yet acknowledged, every stream."""
        return sum(int(self.r.xpending(s, LEARNER_GROUP)["pending"]) for s in self.streams)

    def trim(self) -> dict[str, int]:
        """Drop what every group on a stream has acknowledged (XTRIM MINID); counts per stream."""
        removed: dict[str, int] = {}
        for stream in self.streams:
            floor = safe_trim_floor(self.r, stream)
            if floor is not None:
                removed[stream] = int(self.r.xtrim(stream, minid=floor, approximate=False))
        return removed


def safe_trim_floor(client: redis.Redis, stream: str) -> str | None:
    """The lowest id some group still needs: its oldest pending entry, or past its last delivery."""
    groups = client.xinfo_groups(stream)
    if not groups:
        return None
    floors = []
    for g in groups:
        if int(g["pending"]):
            floors.append(as_text(client.xpending(stream, g["name"])["min"]))
        else:
            ms, seq = _id_key(as_text(g["last-delivered-id"]))
            floors.append(f"{ms}-{seq + 1}")
    return min(floors, key=_id_key)


def _id_key(entry_id: str) -> tuple[int, int]:
    ms, _, seq = entry_id.partition("-")
    return int(ms), int(seq or 0)
