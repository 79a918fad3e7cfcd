"""Per-user rate limits: a counter per user and minute in Redis (one round trip)."""

from __future__ import annotations

import time

import redis.asyncio as aioredis

from agents.events import RATE_PREFIX


class RateLimited(Exception):
    """Over the limit; `retry_after` seconds until the next window."""

    def __init__(self, reason: str, retry_after: int) -> None:
        super().__init__(reason)
        self.reason = reason
        self.retry_after = retry_after


class RateLimiter:
    """Fixed one-minute windows per scope and user."""

    def __init__(self, client: aioredis.Redis) -> None:
        self.client = client

    async def hit(self, scope: str, user_id: str, per_minute: int) -> None:
        """Count one request; RateLimited past `per_minute` in the current minute."""
        now = time.time()
        key = f"{RATE_PREFIX}:{scope}:{user_id}:{int(now // 60)}"
        async with self.client.pipeline(transaction=False) as pipe:
            count, _ = await pipe.incr(key).expire(key, 120).execute()
        if count > per_minute:
            raise RateLimited(
                f"too many {scope} for user {user_id!r}: the limit is {per_minute} per minute",
                retry_after=max(1, 60 - int(now) % 60),
            )
