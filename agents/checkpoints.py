"""Thread checkpoints: LangGraph's saver on plain Redis, under arloop's key prefix."""

from __future__ import annotations

from typing import Any

import redis.asyncio as aioredis
from langgraph_checkpoint_plainredis import AsyncRedisSaver

from agents.events import CHECKPOINT_PREFIX, is_cluster


class _OnCluster:
    """The client as the saver sees it on a Redis Cluster: its MGET of a thread's blobs spans
    slots, so it is split per slot (redis-py's `mget_nonatomic`: a thread is read and written
    under its run lock, so nothing writes it meanwhile). The saver's pipelines are the cluster
    client's, which split per node and are not transactions: a crash in the middle of a
    checkpoint write can leave part of it (docs/deploying.md, "Redis Cluster")."""

    def __init__(self, client: Any) -> None:
        self._client = client

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)

    async def mget(self, keys: Any, *args: Any) -> list[Any]:
        return await self._client.mget_nonatomic(keys, *args)


def make_checkpointer(client: aioredis.Redis, ttl_s: int | None = None) -> AsyncRedisSaver:
    """A checkpointer sharing `client` (bytes replies); `ttl_s` expires idle threads."""
    on = _OnCluster(client) if is_cluster(client) else client
    return AsyncRedisSaver(client=on, prefix=CHECKPOINT_PREFIX, ttl=ttl_s)  # type: ignore[arg-type]
