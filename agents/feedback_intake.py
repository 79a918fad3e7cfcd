"""Feedback intake: check the signed token and the value, then XADD once, atomically.

A Lua script counts the user's rate window, refuses a replay (a marker per trajectory and
kind), sets the marker and XADDs the `FeedbackEvent`. Redis does not roll a script back when
a command in it fails, so the script makes the pair all-or-nothing itself: the marker is set
first (a failure there writes nothing), and taken back if the XADD then fails. The marker
holds the event id and a nonce of this submission, so a retry of the same call after a lost
reply (redis-py retries on connection errors) finds its own marker and answers as the first
attempt did, rather than 409 (scripts only use Redis 6.2 commands).

With sharded streams (`StreamShards`) the script runs in the run's shard; a user's rate window
spans every shard, so it is counted before the script, in a slot of its own (`_count_windows`).
"""

from __future__ import annotations

import asyncio
import hashlib
import math
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass

import redis.asyncio as aioredis

from agents.errors import ArloopError
from agents.events import (
    LEGACY_SEEN_PREFIX,
    ONE_SHARD,
    RATE_PREFIX,
    SCORES_BASE,
    SEEN_BASE,
    FeedbackEvent,
    FeedbackKind,
    StreamShards,
    as_text,
    check_feedback_value,
    check_score_key,
    encode,
    feedback_slot,
    is_cluster,
)
from agents.feedback_tokens import MAX_TOKEN_TTL_S, TokenClaims, TokenError, check_scope, verify

USER_KINDS = (
    FeedbackKind.THUMBS,
    FeedbackKind.RATING,
    FeedbackKind.CORRECTION,
    FeedbackKind.OUTCOME,
    FeedbackKind.SCORE,
)
ScoreRule = Callable[[str | None, str, float], float | None]
"""(agent, key, score) -> reward in [-1, 1] or None: the served packs' `score_reward`."""

# KEYS: the user's rate window, replay marker, stream, the credential's rate window, the run's
# count of named scores (all in the stream's cluster slot: its shard's `feedback_tag`), then on
# a plain Redis the marker's name before the hash tags (honoured until it expires).
# ARGV: user limit (-1: the windows were counted before, `_count_windows`), window s, marker ttl s,
# marker value (event id|nonce), credential limit (0: none), named scores a run may take (0: not
# a named score), the stream's MAXLEN ~ (0: none), then the stream entry's field/value pairs.
_ACCEPT = """
local seen = redis.call('GET', KEYS[2])
if not seen and KEYS[6] then seen = redis.call('GET', KEYS[6]) end
if seen == ARGV[4] then return {'again', seen} end
if tonumber(ARGV[1]) >= 0 then
  local n = redis.call('INCR', KEYS[1])
  if n == 1 then redis.call('EXPIRE', KEYS[1], ARGV[2]) end
  if n > tonumber(ARGV[1]) then return {'rate', 'user'} end
  if tonumber(ARGV[5]) > 0 then
    local k = redis.call('INCR', KEYS[4])
    if k == 1 then redis.call('EXPIRE', KEYS[4], ARGV[2]) end
    if k > tonumber(ARGV[5]) then return {'rate', 'key'} end
  end
end
if seen then return {'dup', seen} end
local scores = tonumber(ARGV[6])
if scores > 0 then
  local named = redis.pcall('INCR', KEYS[5])
  if type(named) == 'table' and named.err then return {'error', named.err} end
  redis.pcall('EXPIRE', KEYS[5], ARGV[3])
  if named > scores then
    redis.pcall('DECR', KEYS[5])
    return {'cap', tostring(scores)}
  end
end
local function undo(err)
  if scores > 0 then redis.pcall('DECR', KEYS[5]) end
  return {'error', err}
end
local marked = redis.pcall('SET', KEYS[2], ARGV[4], 'EX', ARGV[3], 'NX')
if type(marked) == 'table' and marked.err then return undo(marked.err) end
local id
if tonumber(ARGV[7]) > 0 then
  id = redis.pcall('XADD', KEYS[3], 'MAXLEN', '~', ARGV[7], '*', unpack(ARGV, 8))
else
  id = redis.pcall('XADD', KEYS[3], '*', unpack(ARGV, 8))
end
if type(id) == 'table' and id.err then
  redis.call('DEL', KEYS[2])
  return undo(id.err)
end
return {'ok', id}
"""


class FeedbackRejected(ArloopError):
    """Feedback not accepted; `status` is the HTTP answer (401/403/409/422/429, or 500/503 when
    Redis refused the write: then nothing was written)."""


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
    credential: str | None = None
    """The API key's name it came with (the reward cap counts per credential too)."""
    credential_rate_per_minute: int | None = None
    """Feedback that credential may send per minute, all its users together (None: no limit)."""
    key: str | None = None
    """A named score's name (kind `score`; `value` is the score, `text` the comment)."""
    tenant: str = "default"
    """The API key's tenant: a token of another tenant's user is refused (403)."""


REVIEW_MARKER_TTL_S = 180 * 86400
"""How long a run's review marker refuses a second review (the queue also skips a run whose
review is in the stream)."""


@dataclass(frozen=True)
class Review:
    """A reviewer's verdict on one logged run (`POST /v1/review/{trajectory_id}`)."""

    trajectory_id: str
    policy_version: str
    agent: str
    reviewer: str
    """The reviewer's stored id (a pseudonym, as any user's)."""
    score: float
    """0..1: how right the answer returned was (1 right, 0 wrong)."""
    text: str | None = None
    """The right answer (a triage level, a number) or a corrected reply."""
    credential: str | None = None
    credential_rate_per_minute: int | None = None


def feedback_event_id(trajectory_id: str, kind: str) -> str:
    """Deterministic per trajectory and kind, so a retried submission is the same event."""
    return "fb_" + hashlib.sha256(f"{trajectory_id}|{kind}".encode()).hexdigest()[:32]


class FeedbackIntake:
    """Validates submissions and writes accepted ones to their shard of the feedback stream."""

    def __init__(
        self,
        client: aioredis.Redis,
        secret: str,
        rate_per_minute: int,
        scrub: Callable[[str], str] | None = None,
        score_reward: ScoreRule | None = None,
        clock: Callable[[], float] = time.time,
        scores_per_run: int = 8,
        max_entries: int | None = None,
        shards: StreamShards = ONE_SHARD,
    ) -> None:
        self.secret = secret
        self.shards = shards  # a feedback goes to its run's shard (`StreamShards.of`)
        self.rate_per_minute = rate_per_minute
        self.scores_per_run = scores_per_run  # named scores one run (one token) may take
        # each shard's XADD MAXLEN ~ (None: unbounded)
        self.max_entries = None if max_entries is None else -(-max_entries // shards.count)
        self.clock = clock  # seconds since the epoch: its minute is the rate window
        self.scrub = scrub  # a correction's text is user text: PHI scrubbed before Redis
        self.score_reward = score_reward  # None: named scores are kept but not learned from
        self._accept = client.register_script(_ACCEPT)
        self._client = client
        self._cluster = is_cluster(client)

    async def accept(self, sub: FeedbackSubmission) -> str:
        """The event id of the accepted feedback; FeedbackRejected says why not."""
        try:
            claims = verify(self.secret, sub.feedback_token)
            check_scope(claims, sub.trajectory_id, sub.user_id, sub.tenant)
        except TokenError as exc:
            raise FeedbackRejected(exc.status, exc.reason) from exc
        event = self._event(sub, claims)
        if self.scrub is not None and event.text:  # CPU-heavy (presidio): off the event loop
            event = event.model_copy(
                update={"text": await asyncio.to_thread(self.scrub, event.text)}
            )
        key_limit = sub.credential_rate_per_minute if sub.credential else None
        return await self._write(event, marker_ttl(claims, self.clock()), key_limit or 0)

    async def accept_review(self, review: Review) -> str:
        """The event id of a reviewer's verdict, written as a `review` feedback event (source
        `review`) through the same script: one review per run (a second one is a 409), the
        reviewer's and the key's rate windows, the text PHI-scrubbed."""
        try:
            check_feedback_value(FeedbackKind.REVIEW, review.score, review.text)
        except ValueError as exc:
            raise FeedbackRejected(422, str(exc)) from exc
        text = (review.text or "").strip() or None
        if self.scrub is not None and text:
            text = await asyncio.to_thread(self.scrub, text)
        event = FeedbackEvent(
            event_id=feedback_event_id(review.trajectory_id, FeedbackKind.REVIEW.value),
            trajectory_id=review.trajectory_id,
            user_id=review.reviewer,
            kind=FeedbackKind.REVIEW,
            value=review.score,
            text=text,
            policy_version=review.policy_version,
            source="review",
            agent=review.agent,
            credential=review.credential,
        )
        key_limit = review.credential_rate_per_minute if review.credential else None
        return await self._write(event, REVIEW_MARKER_TTL_S, key_limit or 0)

    def _event(self, sub: FeedbackSubmission, claims: TokenClaims) -> FeedbackEvent:
        kind = _kind(sub.kind)
        try:
            check_feedback_value(kind, sub.value, sub.text)
            check_score_key(kind, sub.key)
        except ValueError as exc:
            raise FeedbackRejected(422, str(exc)) from exc
        return FeedbackEvent(
            event_id=feedback_event_id(claims.trajectory_id, feedback_slot(kind, sub.key)),
            trajectory_id=claims.trajectory_id,
            user_id=claims.user_id,
            kind=kind,
            value=sub.value,
            text=sub.text,
            policy_version=claims.policy_version,
            turn=sub.turn,
            agent=claims.agent,
            credential=sub.credential,
            key=sub.key,
            reward=self._reward(claims.agent, kind, sub.key, sub.value),
        )

    def _reward(
        self, agent: str | None, kind: FeedbackKind, key: str | None, score: float | None
    ) -> float | None:
        """A named score read by its pack's rule; whatever the rule returns, a reward in [-1, 1]
        or None (a rule is a team's code: NaN or 7 must not reach the learner)."""
        if kind is not FeedbackKind.SCORE or self.score_reward is None or key is None:
            return None
        reward = self.score_reward(agent, key, float(score))  # type: ignore[arg-type]
        if reward is None or not math.isfinite(reward):
            return None
        return min(1.0, max(-1.0, float(reward)))

    async def _write(self, event: FeedbackEvent, ttl: int, key_limit: int) -> str:
        """XADD `event` once (the script above); `ttl`: its replay marker's life in seconds."""
        now = self.clock()
        window = int(now // 60)
        shard = self.shards.of(event.trajectory_id)
        tag = self.shards.feedback_tag(shard)
        keys = [
            f"{RATE_PREFIX}:{tag}:feedback:{event.user_id}:{window}",
            f"{SEEN_BASE}:{tag}:{event.trajectory_id}:{event.slot}",
            self.shards.feedback(shard),
            f"{RATE_PREFIX}:{tag}:feedback-key:{event.credential}:{window}",
            f"{SCORES_BASE}:{tag}:{event.trajectory_id}",
        ]
        if not self._cluster and self.shards.count == 1:
            keys.append(f"{LEGACY_SEEN_PREFIX}:{event.trajectory_id}:{event.slot}")
        marker = f"{event.event_id}|{secrets.token_hex(8)}"
        fields = [x for pair in encode(event).items() for x in pair]
        scores = self.scores_per_run if event.kind is FeedbackKind.SCORE else 0
        cap = self.max_entries or 0
        user_limit = self.rate_per_minute
        if self.shards.count > 1:
            await self._count_windows(event, window, key_limit)
            user_limit = -1
        args = [user_limit, 120, ttl, marker, key_limit, scores, cap, *fields]
        status, detail = (as_text(v) for v in await self._accept(keys=keys, args=args))
        if status == "rate":
            self._too_much(event, now, detail, key_limit)
        if status == "error":
            raise FeedbackRejected(
                503 if detail.startswith(("OOM", "READONLY", "MASTERDOWN")) else 500,
                f"Redis refused to store the feedback ({detail}); nothing was written, so "
                "sending it again is safe",
            )
        if status == "cap":
            raise FeedbackRejected(
                409,
                f"this run already has {detail} named scores, the most one run takes "
                "(ARLOOP_FEEDBACK_SCORES_PER_RUN); a score already given cannot be changed",
            )
        if status == "dup":
            raise FeedbackRejected(
                409,
                f"{event.slot} feedback on this trajectory was already accepted "
                f"(event_id {detail.split('|')[0]}); each kind (each named score) is taken "
                "once per trajectory",
            )
        return event.event_id

    async def _count_windows(self, event: FeedbackEvent, window: int, key_limit: int) -> None:
        """Count the user's (and the credential's) rate window before the script, each in a slot
        of its own: with sharded streams a user's feedback spans every shard, and the limit is
        the user's, not one per shard. FeedbackRejected 429 past a limit."""
        user = f"{RATE_PREFIX}:{{u:{event.user_id}}}:feedback:{window}"
        if await self._incr(user) > self.rate_per_minute:
            self._too_much(event, self.clock(), "user", key_limit)
        if key_limit > 0:
            key = f"{RATE_PREFIX}:{{k:{event.credential}}}:feedback-key:{window}"
            if await self._incr(key) > key_limit:
                self._too_much(event, self.clock(), "key", key_limit)

    async def _incr(self, window: str) -> int:
        """INCR a rate window, and give it its 120 s on its first count: one call almost always
        (a Lua call costs a master ten times an INCR, a pipeline the agent API twice). A crash
        between the two leaves one key without expiry, which never counts again: its minute is
        in its name."""
        count = int(await self._client.incr(window))
        if count == 1:
            await self._client.expire(window, 120)
        return count

    def _too_much(self, event: FeedbackEvent, now: float, who: str, key_limit: int) -> None:
        wait = max(1, 60 - int(now) % 60)
        whom, limit = (
            ("this user", self.rate_per_minute)
            if who == "user"
            else (f"API key {event.credential!r}, all its users together", key_limit)
        )
        raise FeedbackRejected(
            429,
            f"too much feedback from {whom}: {limit} per minute; retry in {wait} s",
            retry_after=wait,
        )


def marker_ttl(claims: TokenClaims, now: float) -> int:
    """Seconds the replay marker must live: past the token's expiry (a replay must meet it).
    A token whose expiry lies beyond the longest life this service issues is refused (401)
    before anything is written: Redis refuses such a TTL, and no issued token has one."""
    left = claims.expires_at - int(now)
    if left > MAX_TOKEN_TTL_S:
        raise FeedbackRejected(
            401,
            f"feedback_token expires in {left} s, beyond the longest token life of this "
            f"service ({MAX_TOKEN_TTL_S} s): send the token the run returned, unchanged",
        )
    return max(60, left + 60)


def _kind(kind: str) -> FeedbackKind:
    try:
        parsed = FeedbackKind(kind)
    except ValueError:
        parsed = None
    if parsed not in USER_KINDS:
        allowed = ", ".join(k.value for k in USER_KINDS)
        raise FeedbackRejected(422, f"kind must be one of {allowed}; got {kind!r}")
    return parsed
