"""Erase one user's data from Redis: threads (records and LangGraph checkpoints), long-term
memory and their events in the streams; then ask the learner to erase its copy. Rate windows,
counters named by the pseudonym alone, expire within two minutes (and count erasures too).

The request is recorded last (`FORGET_REQUESTS`: stored user id -> when): by then the user's
events are gone from the streams, so whatever the learner read of them is already in its store
when it reads the request and erases them there (`learner.store.Store.forget_users`). A call
that stops midway is safe to repeat. What a released policy already learned from the user stays
in its weights: erasure removes the data, it does not retrain.
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import asdict, dataclass

import redis.asyncio as aioredis

from agents.checkpoints import make_checkpointer
from agents.events import (
    FORGET_REQUESTS,
    MEMORY_PREFIX,
    ONE_SHARD,
    THREAD_PREFIX,
    StreamShards,
    as_text,
)
from agents.threads import lock_key, thread_key

SCAN_COUNT = 1000


@dataclass(frozen=True)
class Erased:
    """What `forget_user` removed."""

    threads: int
    memories: int
    events: int

    def view(self) -> dict[str, int]:
        return asdict(self)


async def forget_user(
    client: aioredis.Redis, user_id: str, shards: StreamShards = ONE_SHARD
) -> Erased:
    """Remove everything Redis holds of `user_id` (the stored id, `deploy.credentials.pseudonym`)
    from every shard's streams, and record the request for the learner."""
    threads = await _threads_of(client, user_id)
    checkpoints = make_checkpointer(client)
    for thread_id in threads:
        await checkpoints.adelete_thread(thread_id)
        await client.delete(thread_key(thread_id), lock_key(thread_id))
    memories = await _delete_matching(client, f"{MEMORY_PREFIX}:{user_id}:*")
    events, runs = 0, set()
    quoted = json.dumps(user_id).encode()
    for stream in shards.all_trajectories():  # runs first: the feedback on them goes too
        events += await _delete_entries(client, stream, quoted, runs, is_runs=True)
    for stream in (*shards.all_feedback(), *shards.all_dead()):  # a reviewer's included
        events += await _delete_entries(client, stream, quoted, runs, is_runs=False)
    await client.hset(FORGET_REQUESTS, user_id, f"{time.time():.3f}")
    return Erased(threads=len(threads), memories=memories, events=events)


async def _threads_of(client: aioredis.Redis, user_id: str) -> list[str]:
    """The ids of the threads whose record names `user_id` (a scan: erasure is rare)."""
    prefix = f"{THREAD_PREFIX}:"
    keys = [
        as_text(k)
        async for k in client.scan_iter(match=f"{prefix}*", count=SCAN_COUNT)
        if not as_text(k).endswith(":lock")
    ]
    owners = []
    for start in range(0, len(keys), SCAN_COUNT):
        async with client.pipeline(transaction=False) as pipe:
            for key in keys[start : start + SCAN_COUNT]:
                pipe.hget(key, "user")
            owners += await pipe.execute()
    return [
        k[len(prefix) :] for k, o in zip(keys, owners, strict=True) if o and as_text(o) == user_id
    ]


async def _delete_matching(client: aioredis.Redis, pattern: str) -> int:
    keys = [k async for k in client.scan_iter(match=pattern, count=SCAN_COUNT)]
    for start in range(0, len(keys), SCAN_COUNT):
        await client.delete(*keys[start : start + SCAN_COUNT])
    return len(keys)


async def _delete_entries(
    client: aioredis.Redis, stream: str, quoted_user: bytes, runs: set[bytes], *, is_runs: bool
) -> int:
    """XDEL every entry whose event names the user (its JSON holds `"<user id>"`: pseudonyms
    are unique strings, and a poison entry that does not parse is matched all the same), or is
    about one of `runs` (the ids of the user's runs deleted so far: a trajectory stream's
    entries, `is_runs`, add theirs, so feedback from others on them, a reviewer's verdict, goes
    too)."""
    start, deleted = "-", 0
    while True:
        batch = await client.xrange(stream, min=start, count=SCAN_COUNT)
        mine = []
        for entry_id, fields in batch:
            data = _data(fields)
            about = _ABOUT_RUN.search(data)
            if quoted_user in data or (about is not None and about.group(1) in runs):
                mine.append(entry_id)
                if is_runs:
                    runs.add(_event_id(fields))
        if mine:
            deleted += await client.xdel(stream, *mine)
        if len(batch) < SCAN_COUNT:
            return deleted
        start = "(" + as_text(batch[-1][0])


_ABOUT_RUN = re.compile(rb'"trajectory_id":"([^"\\]+)"')
"""The run a feedback event is about, as `model_dump_json` writes it."""


def _event_id(fields: dict) -> bytes:
    value = fields.get(b"event_id", fields.get("event_id", b""))
    return value if isinstance(value, bytes) else value.encode()


def _data(fields: dict) -> bytes:
    value = fields.get(b"data", fields.get("data", b""))
    return value if isinstance(value, bytes) else value.encode()
