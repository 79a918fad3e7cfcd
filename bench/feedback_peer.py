"""The feedback endpoint a user would write instead of arloop's, for `bench_feedback_ingest.py`:
a pydantic body, the check of the run's sealed token (`agents.feedback_tokens.verify`), one
XADD. Nothing else (no API key, no rate window, no replay marker, no value check per kind)."""

from __future__ import annotations

import os

import redis.asyncio as aioredis
from fastapi import FastAPI, HTTPException
from pydantic import BaseModel

from agents.feedback_tokens import TokenError, verify

SECRET = os.environ.get("PEER_SECRET", "")
STREAM = "bench:peer:feedback"
app = FastAPI()
client = aioredis.from_url(os.environ.get("PEER_REDIS_URL", "redis://127.0.0.1:6379/0"))


class Feedback(BaseModel):
    trajectory_id: str
    feedback_token: str
    kind: str
    value: float | None = None


@app.post("/v1/feedback", status_code=202)
async def feedback(body: Feedback) -> dict[str, str]:
    try:
        claims = verify(SECRET, body.feedback_token)  # the run's sealed token (AES-GCM)
    except TokenError as exc:
        raise HTTPException(exc.status, exc.reason) from None
    if claims.trajectory_id != body.trajectory_id:
        raise HTTPException(403, "not this trajectory's token")
    event_id = await client.xadd(STREAM, {"user": claims.user_id, "data": body.model_dump_json()})
    return {"event_id": event_id.decode()}
