"""ASGI middleware that refuses oversized request bodies with 413 before anything parses them."""

from __future__ import annotations

import json


class BodySizeLimit:
    """Buffers at most `max_bytes` of a request body; more is a 413 with a reason."""

    def __init__(self, app, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            return await self._refuse(send)
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
        headers = [(b"content-type", b"application/json"),
                   (b"content-length", str(len(payload)).encode()), (b"connection", b"close")]
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
