"""Thread checkpoints: LangGraph's saver on plain Redis, under arloop's key prefix."""

from __future__ import annotations

import redis.asyncio as aioredis
from langgraph_checkpoint_plainredis import AsyncRedisSaver

from agents.events import CHECKPOINT_PREFIX


def make_checkpointer(client: aioredis.Redis, ttl_s: int | None = None) -> AsyncRedisSaver:
    """A checkpointer sharing `client` (bytes replies); `ttl_s` expires idle threads."""
    return AsyncRedisSaver(client=client, prefix=CHECKPOINT_PREFIX, ttl=ttl_s)
