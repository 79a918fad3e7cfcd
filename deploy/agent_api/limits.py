"""The agent API's limits: request bodies over a size (413, refused before anything parses them)
and requests per user and minute (429, one Redis round trip)."""

from __future__ import annotations

import json
import time

import redis.asyncio as aioredis

from agents.errors import ArloopError
from agents.events import RATE_PREFIX


class BodySizeLimit:
    """A body declared over `max_bytes` is a 413 before it is read; one sent without a length
    (chunked) is buffered up to `max_bytes`, and a 413 past it."""

    def __init__(self, app, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None and declared.isdigit():
            if int(declared) > self.max_bytes:
                return await self._refuse(send)
            # the server delivers no more than Content-Length: nothing to count or buffer
            return await self.app(scope, receive, send)
        body, more = b"", True
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                return None
            body += message.get("body", b"")
            more = message.get("more_body", False)
            if len(body) > self.max_bytes:
                return await self._refuse(send)
        return await self.app(scope, _replay(body, receive), send)

    async def _refuse(self, send) -> None:
        reason = f"request body is over {self.max_bytes} bytes (ARLOOP_MAX_BODY_BYTES)"
        payload = json.dumps({"detail": reason}).encode()
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(payload)).encode()),
            (b"connection", b"close"),
        ]
        await send({"type": "http.response.start", "status": 413, "headers": headers})
        await send({"type": "http.response.body", "body": payload})


def _replay(body: bytes, receive):
    sent = False

    async def replay():
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()  # after the body: wait for the disconnect, as servers do

    return replay


class RateLimited(ArloopError):
    """Over the limit (429); `retry_after` seconds until the next window."""

    def __init__(self, reason: str, retry_after: int) -> None:
        super().__init__(429, reason, retry_after)


class RateLimiter:
    """Fixed one-minute windows per scope and user."""

    def __init__(self, client: aioredis.Redis) -> None:
        self.client = client

    async def hit(
        self,
        scope: str,
        user_id: str,
        per_minute: int,
        credential: tuple[str, int] | None = None,
    ) -> None:
        """Count one request for the user (and for the `(name, per_minute)` credential, all
        its users together); RateLimited past either limit in the current minute."""
        now = time.time()
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
