"""A stream split into shards, read back as one: entries merged by entry id, then by shard.

Each shard's stream numbers its own entries, so two shards can hold the same entry id (two runs
logged in the same millisecond): ties go by shard, and a cursor names a place in that order,
`<ms>-<seq>` with one shard (the entry id, as before sharding) and `<ms>-<seq>.<shard>` with
several. Reading on past a cursor is then exact on every shard, one bound per shard (a Redis
Cluster takes no command over two streams).
"""

from __future__ import annotations

import re
from collections import deque
from collections.abc import Awaitable, Callable

import redis.asyncio as aioredis

from agents.errors import ArloopError
from agents.events import StreamShards, as_text

CURSOR = r"^\d{1,19}-\d{1,19}(\.\d{1,2})?$"
"""A cursor as the API hands it out: a stream entry id (19 digits: below Redis's 2^64 bound),
and the shard when the streams have several."""
_CURSOR = re.compile(CURSOR)

Entry = tuple[str, int, dict]
"""(entry id, shard, fields)."""


def cursor_of(entry_id: str, shard: int, shards: StreamShards) -> str:
    return entry_id if shards.count == 1 else f"{entry_id}.{shard}"


def parse_cursor(value: str, shards: StreamShards) -> tuple[str, int]:
    """(entry id, shard) of a cursor; a cursor without a shard, or with one past the streams'
    (from before a change of shard count), stands after that id's entries on every shard."""
    if not _CURSOR.match(value):
        raise ArloopError(
            422,
            f"cursor={value[:40]!r} is not a stream entry id ('<ms>-<seq>', then '.<shard>' "
            "with sharded streams: from next_cursor)",
        )
    entry_id, _, shard = value.partition(".")
    last = shards.count - 1
    return entry_id, min(int(shard), last) if shard else last


def bounds_after(cursor: str, shards: StreamShards) -> list[str]:
    """Per shard, where reading goes on past `cursor` (either way): past its entry id on the
    shards up to the cursor's, at it on the shards after."""
    entry_id, at = parse_cursor(cursor, shards)
    return [("(" if k <= at else "") + entry_id for k in range(shards.count)]


def entry_key(entry_id: str) -> tuple[int, int]:
    ms, _, seq = entry_id.partition("-")
    return int(ms), int(seq)


class Merged:
    """The entries of one stream per shard in one order (newest or oldest first), each shard
    read `batch` entries at a time from its start bound to `end`."""

    def __init__(
        self,
        client: aioredis.Redis,
        streams: tuple[str, ...],
        starts: list[str],
        end: str,
        *,
        newest_first: bool,
        batch: int,
        on_read: Callable[[int, str], Awaitable[None]] | None = None,
    ) -> None:
        self.client, self.streams, self.end = client, streams, end
        self.newest_first, self.batch = newest_first, batch
        self.on_read = on_read
        """Called with (shard, the last entry id read) after each read of a shard."""
        # None: the shard is read to its end (Redis refuses a range that ends before 0-0)
        self.starts: list[str | None] = [
            None if newest_first and s == "(0-0" else s for s in starts
        ]
        self.heads: list[deque[tuple[str, dict]]] = [deque() for _ in streams]

    async def next(self) -> Entry | None:
        """The next entry in order; None past the last."""
        for k in range(len(self.streams)):
            if not self.heads[k] and self.starts[k] is not None:
                await self._read(k)
        live = [k for k, head in enumerate(self.heads) if head]
        if not live:
            return None
        if self.newest_first:
            k = max(live, key=lambda k: (entry_key(self.heads[k][0][0]), -k))
        else:
            k = min(live, key=lambda k: (entry_key(self.heads[k][0][0]), k))
        entry_id, fields = self.heads[k].popleft()
        return entry_id, k, fields

    async def _read(self, k: int) -> None:
        stream, start = self.streams[k], self.starts[k]
        if self.newest_first:
            batch = await self.client.xrevrange(stream, max=start, min=self.end, count=self.batch)
        else:
            batch = await self.client.xrange(stream, min=start, max=self.end, count=self.batch)
        self.heads[k].extend((as_text(i), f) for i, f in batch)
        self.starts[k] = "(" + as_text(batch[-1][0]) if len(batch) == self.batch else None
        if batch and self.on_read is not None:
            await self.on_read(k, as_text(batch[-1][0]))
