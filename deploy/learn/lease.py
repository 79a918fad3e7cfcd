"""One learner at a time: a lease in Redis with a fencing token.

Two learners on one Redis split the streams between them (a run's trajectory read by one, its
feedback by the other: trained by neither) and race for the champion alias. So a learner
takes `arloop:learner:lease` before it reads anything: `SET NX PX` with a value of
`<token>|<holder>`, the token a counter that only grows. It renews the lease from a thread
while it works; every registry write it makes carries the value and is refused (`Fenced`) once
the key holds another, so a learner that paused past its lease (a long GC, a stopped VM)
publishes nothing after another took over. A second learner waits for the lease (or, with
`--once`, says who holds it and exits); a lease whose holder ran on this host and is gone
(killed) is taken over at once, so a learner restarted after a crash does not wait.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass

import redis

from agents.events import LEARNER_FENCE, LEARNER_LEASE, as_text
from learner.policy.registry import Fence

log = logging.getLogger("arloop.learner")

# KEYS: lease, fence counter. ARGV: holder, ttl ms, the value to take over from ('': none).
_ACQUIRE = """
local held = redis.call('GET', KEYS[1])
if held and held ~= ARGV[3] then return {'held', held, redis.call('PTTL', KEYS[1])} end
local token = redis.call('INCR', KEYS[2])
local value = token .. '|' .. ARGV[1]
redis.call('SET', KEYS[1], value, 'PX', ARGV[2])
return {'ok', value, ARGV[2]}
"""
# KEYS: lease. ARGV: value, ttl ms (0: release).
_RENEW = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
if tonumber(ARGV[2]) == 0 then return redis.call('DEL', KEYS[1]) end
return redis.call('PEXPIRE', KEYS[1], ARGV[2])
"""


class LeaseHeld(RuntimeError):
    """Another learner holds the lease; the message names it and when it expires."""


@dataclass(frozen=True)
class Holder:
    token: int
    name: str
    expires_in_s: float


def holder_name(consumer: str) -> str:
    """`learner-1@host:pid`: who holds a lease, as messages show it."""
    return f"{consumer}@{socket.gethostname()}:{os.getpid()}"


def _died_here(name: str) -> bool:
    """The holder ran on this host and its process is gone (killed): its lease is void."""
    host, _, pid = name.rpartition("@")[2].rpartition(":")
    if host != socket.gethostname() or not pid.isdigit():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


class LearnerLease:
    """Acquire, renew (from a thread) and release the learner's lease."""

    def __init__(self, client: redis.Redis, holder: str, ttl_s: float) -> None:
        self.client = client
        self.holder = holder
        self.ttl_ms = int(ttl_s * 1000)
        self.fence: Fence | None = None
        self._acquire = client.register_script(_ACQUIRE)
        self._renew = client.register_script(_RENEW)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def acquire(self) -> Fence:
        """The lease's fence; LeaseHeld naming the holder when another learner has it."""
        if self.fence is not None and self.renew():
            return self.fence  # ours already (a second start of the same learner)
        status, value, ttl = self._take("")
        if status == "held" and _died_here(value.partition("|")[2]):
            status, value, ttl = self._take(value)  # its process is gone: no need to wait
        if status == "held":
            token, _, name = value.partition("|")
            raise LeaseHeld(
                f"another learner holds the lease: {name} (fencing token {token}), for "
                f"{int(ttl) / 1000:.0f} s more unless it renews it. One learner at a time: "
                "two would split the streams and race for the champion"
            )
        self.fence = Fence(LEARNER_LEASE, value)
        return self.fence

    def _take(self, over: str) -> tuple[str, str, int]:
        status, value, ttl = self._acquire(
            keys=[LEARNER_LEASE, LEARNER_FENCE], args=[self.holder, self.ttl_ms, over]
        )
        return as_text(status), as_text(value), int(ttl)

    def current(self) -> Holder | None:
        """Who holds the lease now, if anyone."""
        value, ttl = self.client.get(LEARNER_LEASE), self.client.pttl(LEARNER_LEASE)
        if value is None:
            return None
        token, _, name = value.decode().partition("|")
        return Holder(int(token), name, max(ttl, 0) / 1000)

    def renew(self) -> bool:
        """Extend the lease; False when it is no longer ours."""
        if self.fence is None:
            return False
        return bool(self._renew(keys=[LEARNER_LEASE], args=[self.fence.value, self.ttl_ms]))

    def keep(self, on_lost: Callable[[str], None]) -> None:
        """Renew every third of the lease from a daemon thread; `on_lost(reason)` once lost."""

        def loop() -> None:
            while not self._stop.wait(self.ttl_ms / 3000):
                try:
                    if not self.renew():
                        on_lost("the lease expired and another learner took it")
                        return
                except redis.RedisError as exc:  # Redis away: the lease may lapse; writes check
                    log.warning("could not renew the learner lease: %s", exc)

        self._thread = threading.Thread(target=loop, name="learner-lease", daemon=True)
        self._thread.start()

    def release(self) -> None:
        """Stop renewing and give the lease up (only if it is still ours)."""
        self._stop.set()
        if self.fence is not None:
            try:
                self._renew(keys=[LEARNER_LEASE], args=[self.fence.value, 0])
            except redis.RedisError:
                pass  # it expires by itself
