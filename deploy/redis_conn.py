"""How every arloop process connects to Redis: credentials, TLS, health checks and retries.

Stated here rather than left to redis-py's defaults, which have changed between releases (no
retry at all before 6.0): a pooled connection idle longer than `redis_health_check_s` is
PINGed before use, and a command that meets a connection error or a timeout (a restarted or
failed-over Redis, a connection it dropped) is retried on a fresh connection with exponential
backoff and jitter, `redis_retries` times, before the caller sees the error.
"""

from __future__ import annotations

from typing import Any, Protocol

import redis
import redis.asyncio as aioredis
from redis.asyncio.retry import Retry as AsyncRetry
from redis.backoff import ExponentialWithJitterBackoff
from redis.exceptions import BusyLoadingError, ConnectionError, TimeoutError
from redis.retry import Retry

RETRY_ON = [ConnectionError, TimeoutError, BusyLoadingError]
"""What a retry can fix: the connection, or a Redis still loading its data after a restart."""


class RedisSettings(Protocol):
    """The settings fields `options` reads (declared in `deploy.settings.CommonSettings`)."""

    redis_username: str | None
    redis_password: Any
    redis_ca_cert: Any
    redis_health_check_s: float
    redis_retries: int


def options(s: RedisSettings, url: str, *, asyncio: bool = False) -> dict[str, Any]:
    """redis-py client keyword arguments for these settings (on top of the URL's own);
    `asyncio` for a `redis.asyncio` client."""
    backoff = ExponentialWithJitterBackoff(base=0.05, cap=2.0)
    out: dict[str, Any] = {
        "health_check_interval": s.redis_health_check_s,
        "retry": (AsyncRetry if asyncio else Retry)(backoff, s.redis_retries),
        "retry_on_error": list(RETRY_ON),
        "socket_keepalive": True,
    }
    if s.redis_username:
        out["username"] = s.redis_username
    if s.redis_password is not None:
        out["password"] = s.redis_password.get_secret_value()
    if s.redis_ca_cert is not None and url.startswith("rediss://"):
        out["ssl_ca_certs"] = str(s.redis_ca_cert)
    return out


def sync_client(url: str, s: RedisSettings, **extra: Any) -> redis.Redis:
    """A blocking client for `url` with the settings' credentials, TLS, checks and retries."""
    return redis.Redis.from_url(url, **(options(s, url) | extra))


def async_client(url: str, s: RedisSettings, **extra: Any) -> aioredis.Redis:
    """The asyncio twin of `sync_client`."""
    return aioredis.from_url(url, **(options(s, url, asyncio=True) | extra))
