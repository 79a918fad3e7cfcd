"""Sharded streams read as one: entries merged by entry id, then shard (two shards can hold the
same id), and a cursor that goes on exactly past its entry, each entry once a page at a time."""

from __future__ import annotations

import pytest

from agents.errors import ArloopError
from agents.events import ONE_SHARD, StreamShards
from deploy.agent_api.stream_merge import Merged, bounds_after, cursor_of, parse_cursor

SHARDS = StreamShards(3)
IDS = {0: ["1-1", "5-0", "7-0"], 1: ["1-1", "6-0", "7-0", "10-0"], 2: ["5-0"]}
"""Entry ids per shard: `1-1`, `5-0` and `7-0` are in two shards each."""
OLDEST_FIRST = [
    ("1-1", 0),
    ("1-1", 1),
    ("5-0", 0),
    ("5-0", 2),
    ("6-0", 1),
    ("7-0", 0),
    ("7-0", 1),
    ("10-0", 1),
]
NEWEST_FIRST = [
    ("10-0", 1),
    ("7-0", 0),
    ("7-0", 1),
    ("6-0", 1),
    ("5-0", 0),
    ("5-0", 2),
    ("1-1", 0),
    ("1-1", 1),
]
"""Ties go by shard both ways."""


async def written(aredis) -> None:
    for k, ids in IDS.items():
        for entry_id in ids:
            await aredis.xadd(SHARDS.trajectories(k), {"n": f"{entry_id}@{k}"}, id=entry_id)


async def pages(aredis, *, newest_first: bool, size: int, batch: int) -> list[list[tuple]]:
    """Every page of `size` entries, each page read afresh from the last one's cursor."""
    out, cursor = [], None
    while True:
        edge = "+" if newest_first else "-"
        starts = [edge] * 3 if cursor is None else bounds_after(cursor, SHARDS)
        merged = Merged(
            aredis,
            SHARDS.all_trajectories(),
            starts,
            "-" if newest_first else "+",
            newest_first=newest_first,
            batch=batch,
        )
        page = []
        while len(page) < size and (entry := await merged.next()) is not None:
            entry_id, shard, fields = entry
            assert fields[b"n"] == f"{entry_id}@{shard}".encode()
            page.append((entry_id, shard))
        if not page:
            return out
        out.append(page)
        cursor = cursor_of(*page[-1], SHARDS)


@pytest.mark.parametrize("size,batch", [(1, 1), (2, 3), (3, 2), (100, 100)])
async def test_pages_give_every_entry_once_in_order_whatever_their_size(aredis, size, batch):
    await written(aredis)
    for newest_first, order in ((False, OLDEST_FIRST), (True, NEWEST_FIRST)):
        got = await pages(aredis, newest_first=newest_first, size=size, batch=batch)
        assert [e for page in got for e in page] == order, (newest_first, size, batch)


async def test_each_shard_is_read_a_batch_at_a_time_with_where_it_stopped(aredis):
    await written(aredis)
    reads = []

    async def on_read(shard: int, last: str) -> None:
        reads.append((shard, last))

    streams = SHARDS.all_trajectories()
    merged = Merged(aredis, streams, ["+"] * 3, "-", newest_first=True, batch=2, on_read=on_read)
    assert await merged.next() == ("10-0", 1, {b"n": b"10-0@1"})
    assert reads == [(0, "5-0"), (1, "7-0"), (2, "5-0")]  # every shard's newest two


def test_a_cursor_names_its_shard_only_when_there_are_several():
    assert cursor_of("7-0", 0, ONE_SHARD) == "7-0"
    assert cursor_of("7-0", 1, SHARDS) == "7-0.1"
    assert parse_cursor("7-0.1", SHARDS) == ("7-0", 1)
    assert bounds_after("7-0.1", SHARDS) == ["(7-0", "(7-0", "7-0"]
    assert bounds_after("7-0", SHARDS) == ["(7-0"] * 3  # no shard: past the id everywhere
    assert bounds_after("7-0", ONE_SHARD) == ["(7-0"]  # as before sharding
    assert bounds_after("7-0.5", SHARDS) == ["(7-0"] * 3  # more shards once: past it everywhere
    for bad in ("7-0.", "abc", "7-0.1.2"):
        with pytest.raises(ArloopError) as refused:
            parse_cursor(bad, SHARDS)
        assert refused.value.status == 422, bad
