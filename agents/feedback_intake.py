"""Feedback intake: check the signed token and the value, then XADD once, atomically.

A Lua script counts the user's rate window, refuses a replay (a marker per trajectory and
kind), and XADDs the `FeedbackEvent`; the marker is set only after the XADD succeeded, so
the two land together or not at all (scripts only use Redis 6.2 commands).
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections.abc import Callable
from dataclasses import dataclass

import redis.asyncio as aioredis

from agents.errors import ArloopError
from agents.events import (
    FEEDBACK_SEEN_PREFIX,
    RATE_PREFIX,
    STREAM_FEEDBACK,
    FeedbackEvent,
    FeedbackKind,
    check_feedback_value,
    encode,
)
from agents.feedback_tokens import TokenClaims, TokenError, check_scope, verify

USER_KINDS = (
    FeedbackKind.THUMBS,
    FeedbackKind.RATING,
    FeedbackKind.CORRECTION,
    FeedbackKind.OUTCOME,
)

# KEYS: rate window, replay marker, stream. ARGV: limit, window s, marker ttl s, event id,
# then the stream entry's field/value pairs.
_ACCEPT = """
local n = redis.call('INCR', KEYS[1])
if n == 1 then redis.call('EXPIRE', KEYS[1], ARGV[2]) end
if n > tonumber(ARGV[1]) then return {'rate', tostring(redis.call('TTL', KEYS[1]))} end
local seen = redis.call('GET', KEYS[2])
if seen then return {'dup', seen} end
local id = redis.call('XADD', KEYS[3], '*', unpack(ARGV, 5))
redis.call('SET', KEYS[2], ARGV[4], 'EX', ARGV[3])
return {'ok', id}
"""


class FeedbackRejected(ArloopError):
    """Feedback not accepted; `status` is the HTTP answer (401/403/409/422/429)."""


@dataclass(frozen=True)
class FeedbackSubmission:
    """What a client sent to `POST /v1/feedback`."""

    trajectory_id: str
    feedback_token: str | None
    kind: str
    value: float | None = None
    text: str | None = None
    user_id: str | None = None
    turn: int | None = None


def feedback_event_id(trajectory_id: str, kind: str) -> str:
    """Deterministic per trajectory and kind, so a retried submission is the same event."""
    return "fb_" + hashlib.sha256(f"{trajectory_id}|{kind}".encode()).hexdigest()[:32]


class FeedbackIntake:
    """Validates submissions and writes accepted ones to `STREAM_FEEDBACK`."""

    def __init__(
        self,
        client: aioredis.Redis,
        secret: str,
        rate_per_minute: int,
        scrub: Callable[[str], str] | None = None,
    ) -> None:
        self.secret = secret
        self.rate_per_minute = rate_per_minute
        self.scrub = scrub  # a correction's text is user text: PHI scrubbed before Redis
        self._accept = client.register_script(_ACCEPT)

    async def accept(self, sub: FeedbackSubmission) -> str:
        """The event id of the accepted feedback; FeedbackRejected says why not."""
        try:
            claims = verify(self.secret, sub.feedback_token)
            check_scope(claims, sub.trajectory_id, sub.user_id)
        except TokenError as exc:
            raise FeedbackRejected(exc.status, exc.reason) from exc
        event = self._event(sub, claims)
        if self.scrub is not None and event.text:  # CPU-heavy (presidio): off the event loop
            event = event.model_copy(
                update={"text": await asyncio.to_thread(self.scrub, event.text)}
            )
        return await self._write(event, claims)

    def _event(self, sub: FeedbackSubmission, claims: TokenClaims) -> FeedbackEvent:
        kind = _kind(sub.kind)
        try:
            check_feedback_value(kind, sub.value, sub.text)
        except ValueError as exc:
            raise FeedbackRejected(422, str(exc)) from exc
        return FeedbackEvent(
            event_id=feedback_event_id(claims.trajectory_id, kind.value),
            trajectory_id=claims.trajectory_id,
            user_id=claims.user_id,
            kind=kind,
            value=sub.value,
            text=sub.text,
            policy_version=claims.policy_version,
            turn=sub.turn,
            agent=claims.agent,
        )

    async def _write(self, event: FeedbackEvent, claims: TokenClaims) -> str:
        now = time.time()
        window = int(now // 60)
        keys = [
            f"{RATE_PREFIX}:feedback:{claims.user_id}:{window}",
            f"{FEEDBACK_SEEN_PREFIX}:{event.trajectory_id}:{event.kind.value}",
            STREAM_FEEDBACK,
        ]
        marker_ttl = max(60, claims.expires_at - int(now) + 60)
        fields = [x for pair in encode(event).items() for x in pair]
        args = [self.rate_per_minute, 120, marker_ttl, event.event_id, *fields]
        status, detail = (_str(v) for v in await self._accept(keys=keys, args=args))
        if status == "rate":
            wait = max(1, 60 - int(now) % 60)
            raise FeedbackRejected(
                429,
                f"too much feedback from this user: {self.rate_per_minute} per minute; "
                f"retry in {wait} s",
                retry_after=wait,
            )
        if status == "dup":
            raise FeedbackRejected(
                409,
                f"{event.kind.value} feedback on this trajectory was already accepted "
                f"(event_id {detail}); each kind is taken once per trajectory",
            )
        return event.event_id


def _kind(kind: str) -> FeedbackKind:
    try:
        parsed = FeedbackKind(kind)
    except ValueError:
        parsed = None
    if parsed not in USER_KINDS:
        allowed = ", ".join(k.value for k in USER_KINDS)
        raise FeedbackRejected(422, f"kind must be one of {allowed}; got {kind!r}")
    return parsed


def _str(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
