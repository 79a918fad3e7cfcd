"""The feedback endpoint a user would write instead of arloop's, for `bench_feedback_ingest.py`:
a pydantic body, the HMAC check of the token, one XADD. Nothing else (no API key, no rate
window, no replay marker, no value check per kind)."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import time

import redis.asyncio as aioredis
from fastapi import FastAPI, HTTPException
from pydantic import BaseModel

SECRET = os.environ.get("PEER_SECRET", "").encode()
STREAM = "bench:peer:feedback"
app = FastAPI()
client = aioredis.from_url(os.environ.get("PEER_REDIS_URL", "redis://127.0.0.1:6379/0"))


class Feedback(BaseModel):
    trajectory_id: str
    feedback_token: str
    kind: str
    value: float | None = None


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


@app.post("/v1/feedback", status_code=202)
async def feedback(body: Feedback) -> dict[str, str]:
    payload, _, mac = body.feedback_token.partition(".")
    expected = hmac.new(SECRET, payload.encode(), hashlib.sha256).digest()
    if not hmac.compare_digest(_unb64(mac), expected):
        raise HTTPException(401, "bad token")
    trajectory, user, version, expires, *_ = json.loads(_unb64(payload))
    if trajectory != body.trajectory_id or expires < time.time():
        raise HTTPException(403, "not this trajectory's token")
    event_id = await client.xadd(STREAM, {"user": user, "data": body.model_dump_json()})
    return {"event_id": event_id.decode()}
