"""The agent API's limits: request bodies over a size (413, refused before anything parses them)
and requests per user and minute (429, one Redis round trip)."""

from __future__ import annotations

import time
from collections.abc import Callable

import redis.asyncio as aioredis

from agents.errors import ArloopError
from agents.events import RATE_PREFIX


class RateLimited(ArloopError):
    """Over the limit (429); `retry_after` seconds until the next window."""

    def __init__(self, reason: str, retry_after: int) -> None:
        super().__init__(429, reason, retry_after)


class RateLimiter:
    """Fixed one-minute windows per scope and user (`clock`: seconds since the epoch, whose
    minute is the window)."""

    def __init__(self, client: aioredis.Redis, clock: Callable[[], float] = time.time) -> None:
        self.client = client
        self.clock = clock

    async def hit(
        self,
        scope: str,
        user_id: str,
        per_minute: int,
        credential: tuple[str, int] | None = None,
    ) -> None:
        """Count one request for the user (and for the `(name, per_minute)` credential, all
        its users together); RateLimited past either limit in the current minute."""
        now = self.clock()
        window = int(now // 60)
        counted = [(f"{RATE_PREFIX}:{scope}:{user_id}:{window}", per_minute, f"user {user_id!r}")]
        if credential is not None:
            name, limit = credential
            counted.append((f"{RATE_PREFIX}:{scope}-key:{name}:{window}", limit, f"key {name!r}"))
        async with self.client.pipeline(transaction=False) as pipe:
            for key, _, _ in counted:
                pipe.incr(key).expire(key, 120)
            replies = await pipe.execute()
        for (_, limit, who), count in zip(counted, replies[::2], strict=True):
            if count > limit:
                wait = max(1, 60 - int(now) % 60)
                raise RateLimited(
                    f"too many {scope} for {who}: the limit is {limit} per minute; "
                    f"retry in {wait} s",
                    retry_after=wait,
                )

    async def spend(self, scope: str, name: str, amount: int, per_minute: int, what: str) -> None:
        """Take `amount` of `name`'s budget of `what` for this minute (a refused amount is given
        back); RateLimited when it does not fit."""
        now = self.clock()
        key = f"{RATE_PREFIX}:{scope}:{name}:{int(now // 60)}"
        async with self.client.pipeline(transaction=False) as pipe:
            spent, _ = await pipe.incrby(key, amount).expire(key, 120).execute()
        if spent > per_minute:
            await self.client.decrby(key, amount)
            wait = max(1, 60 - int(now) % 60)
            raise RateLimited(
                f"{amount} {what} would take key {name!r} past its {per_minute} a minute "
                f"({spent - amount} spent); retry in {wait} s, or ask for fewer",
                retry_after=wait,
            )
