"""One ASGI middleware both servers put in front of their routes: a body declared over
`max_bytes` is a 413 before it is read; one sent without a length (chunked) is counted as it
arrives and refused past `max_bytes`. Each server says why in its own error shape."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any


class BodyLimit:
    """`error(max_bytes)` is the 413's JSON body (the agent API's `detail`, OpenAI's `error`)."""

    def __init__(self, app, max_bytes: int, error: Callable[[int], dict[str, Any]]) -> None:
        self.app, self.max_bytes, self.error = app, max_bytes, error

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None and declared.isdigit():
            if int(declared) > self.max_bytes:
                return await self._refuse(send)
            # the server delivers no more than Content-Length: nothing to count or buffer
            return await self.app(scope, receive, send)
        chunks, size, more = [], 0, True
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                return None
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            more = message.get("more_body", False)
            if size > self.max_bytes:
                return await self._refuse(send)
        return await self.app(scope, replay(b"".join(chunks), receive), send)

    async def _refuse(self, send) -> None:
        payload = json.dumps(self.error(self.max_bytes)).encode()
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(payload)).encode()),
            (b"connection", b"close"),
        ]
        await send({"type": "http.response.start", "status": 413, "headers": headers})
        await send({"type": "http.response.body", "body": payload})


def replay(body: bytes, receive):
    """A `receive` that gives `body` whole, then what `receive` gives (the disconnect)."""
    sent = False

    async def replay():
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()  # after the body: wait for the disconnect, as servers do

    return replay
