"""Thread records in Redis: who owns a thread, which agent runs it, its policy arm, a run lock.

The arm is drawn once, when a thread starts: `candidate` with probability `canary_share`
while the registry's alias hash has a candidate, else `champion`; it then sticks to the
thread. A thread on `candidate` falls back to `champion` once no candidate exists.
"""

from __future__ import annotations

import random
import secrets
import time
from dataclasses import dataclass

import redis.asyncio as aioredis

from agents.errors import ArloopError
from agents.events import POLICY_ALIASES, THREAD_PREFIX, as_text, in_slot_of

CHAMPION, CANDIDATE = "champion", "candidate"

# Check owner and agent, take the run lock, and draw or reuse the arm, in one atomic step.
# Whether a candidate exists comes in ARGV[9], read before: the registry is not among the
# script's keys, so a Redis user that may only read the registry can run it (a script's
# declared keys need write access).
_OPEN = """
local owner = redis.call('HGET', KEYS[1], 'user')
if owner and owner ~= ARGV[1] then return {'forbidden', owner} end
local agent = redis.call('HGET', KEYS[1], 'agent')
if agent and agent ~= ARGV[2] then return {'agent', agent} end
if not redis.call('SET', KEYS[2], ARGV[5], 'NX', 'PX', ARGV[6]) then return {'busy', ''} end
local has_candidate = ARGV[9] == '1'
local arm = redis.call('HGET', KEYS[1], 'arm')
local new = '0'
if not arm then
  new = '1'
  arm = 'champion'
  if has_candidate and tonumber(ARGV[3]) < tonumber(ARGV[4]) then arm = 'candidate' end
  redis.call('HSET', KEYS[1], 'user', ARGV[1], 'agent', ARGV[2], 'arm', arm, 'created_at', ARGV[8])
elseif arm == 'candidate' and not has_candidate then
  arm = 'champion'
  redis.call('HSET', KEYS[1], 'arm', arm)
end
if tonumber(ARGV[7]) > 0 then redis.call('EXPIRE', KEYS[1], ARGV[7]) end
return {arm, new}
"""
_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""


def thread_key(thread_id: str) -> str:
    """A thread's record: owner, agent, policy arm."""
    return f"{THREAD_PREFIX}:{thread_id}"


def lock_key(thread_id: str) -> str:
    """The thread's run lock, in its record's cluster slot (both are written by one script)."""
    return in_slot_of(thread_key(thread_id), THREAD_PREFIX, "lock")


class ThreadError(ArloopError):
    """A thread cannot be used by this request; `status` is the HTTP answer (403/409)."""


@dataclass(frozen=True)
class ThreadLease:
    """A thread held for one run: its arm, whether it is new, and the lock token."""

    thread_id: str
    arm: str
    new: bool
    token: str


class Threads:
    """Opens threads for runs (ownership, sticky canary arm, one run at a time)."""

    def __init__(
        self,
        client: aioredis.Redis,
        *,
        canary_share: float = 0.0,
        lock_s: float = 300.0,
        ttl_s: int | None = None,
        rng: random.Random | None = None,
    ) -> None:
        self.client = client
        self.canary_share = canary_share
        self.lock_ms = int(lock_s * 1000)
        self.ttl_s = ttl_s or 0
        self.rng = rng or random.Random()
        self._open = client.register_script(_OPEN)
        self._release = client.register_script(_RELEASE)

    def key(self, thread_id: str) -> str:
        return thread_key(thread_id)

    async def open(self, thread_id: str, user_id: str, agent: str) -> ThreadLease:
        """Hold the thread for a run; ThreadError when it is another's, or busy."""
        token = secrets.token_hex(8)
        key = self.key(thread_id)
        args = [
            user_id,
            agent,
            self.rng.random(),
            self.canary_share,
            token,
            self.lock_ms,
            self.ttl_s,
            time.time(),
            int(await self.client.hexists(POLICY_ALIASES, CANDIDATE)),
        ]
        first, second = (
            as_text(v) for v in await self._open(keys=[key, lock_key(thread_id)], args=args)
        )
        if first == "forbidden":
            raise ThreadError(
                403, f"thread {thread_id!r} belongs to another user; omit thread_id for a new one"
            )
        if first == "agent":
            raise ThreadError(
                409,
                f"thread {thread_id!r} belongs to agent {second!r}; run that agent on it, "
                "or omit thread_id to start a new thread",
            )
        if first == "busy":
            raise ThreadError(
                409, f"thread {thread_id!r} is running another request; retry once it has answered"
            )
        return ThreadLease(thread_id, first, second == "1", token)

    async def close(self, lease: ThreadLease) -> None:
        await self._release(keys=[lock_key(lease.thread_id)], args=[lease.token])

    async def record(self, thread_id: str) -> dict[str, str] | None:
        """The thread's record (user, agent, arm, created_at), None when there is none."""
        values = await self.client.hgetall(self.key(thread_id))
        return {as_text(k): as_text(v) for k, v in values.items()} or None

    async def arm(self, thread_id: str) -> str | None:
        value = await self.client.hget(self.key(thread_id), "arm")
        return as_text(value) if value is not None else None
