"""How every arloop process connects to Redis: credentials, TLS, health checks and retries.

Stated here rather than left to redis-py's defaults, which have changed between releases (no
retry at all before 6.0): a pooled connection idle longer than `redis_health_check_s` is
PINGed before use, and a command that meets a connection error or a timeout (a restarted or
failed-over Redis, a connection it dropped) is retried on a fresh connection with exponential
backoff and jitter, `redis_retries` times, before the caller sees the error.

With `redis_cluster` every client is redis-py's cluster client on the URL's node (any node of
the cluster: it learns the others and follows MOVED/ASK). `check_url` turns a setting that
cannot work into one line naming the fix, rather than a traceback at the first command.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any, Protocol
from urllib.parse import urlsplit

import redis
import redis.asyncio as aioredis
import redis.asyncio.cluster as aiocluster
import redis.cluster
from redis.asyncio.retry import Retry as AsyncRetry
from redis.backoff import ExponentialWithJitterBackoff
from redis.exceptions import BusyLoadingError, ConnectionError, TimeoutError
from redis.retry import Retry

from agents.events import STREAM_SHARDS_KEY, StreamShards, check_shards

RETRY_ON = [ConnectionError, TimeoutError, BusyLoadingError]
"""What a retry can fix: the connection, or a Redis still loading its data after a restart."""


class RedisSettings(Protocol):
    """The settings fields `options` reads (declared in `deploy.settings.CommonSettings`)."""

    redis_username: str | None
    redis_password: Any
    redis_ca_cert: Any
    redis_health_check_s: float
    redis_retries: int
    redis_cluster: bool


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


CLUSTER_SCHEMES = ("redis+cluster", "rediss+cluster", "redis-cluster", "cluster")


URL_SCHEMES = ("redis", "rediss", "unix")
"""The schemes redis-py reads (`redis.connection.parse_url`)."""


def check_url(url: str, cluster: bool) -> str | None:
    """Why `url` cannot work with `cluster` mode, with the fix; None when it can."""
    scheme = url.split("://", 1)[0].lower() if "://" in url else ""
    if url and scheme not in URL_SCHEMES + CLUSTER_SCHEMES:
        return _unparsable(url, scheme)
    if scheme in ("redis", "rediss"):
        why = _bad_address(url)
        if why:
            return why
    if scheme in CLUSTER_SCHEMES:
        plain = "rediss" if scheme.startswith("rediss") else "redis"
        return (
            f"ARLOOP_REDIS_URL: redis-py has no {scheme}:// scheme; give any node of the cluster "
            f"as {plain}://host:port and set ARLOOP_REDIS_CLUSTER=true"
        )
    if cluster and url.startswith("unix://"):
        return "ARLOOP_REDIS_CLUSTER=true needs a redis:// or rediss:// URL (a cluster node)"
    db = urlsplit(url).path.strip("/")
    if cluster and db not in ("", "0"):
        return f"ARLOOP_REDIS_URL: a Redis Cluster has only database 0 (drop the /{db})"
    return None


def _unparsable(url: str, scheme: str) -> str:
    """The fix for a URL without a scheme redis-py reads."""
    if not scheme:
        where = url.strip("/") or "127.0.0.1:6379"
        return (
            f"ARLOOP_REDIS_URL: {url!r} has no scheme: write redis://{where}/0 "
            "(rediss:// for TLS, unix:///path/to/redis.sock for a socket)"
        )
    return (
        f"ARLOOP_REDIS_URL: {scheme}:// is not a Redis URL scheme: use redis://host:6379/0, "
        "rediss:// for TLS or unix:///path/to/redis.sock"
    )


def _bad_address(url: str) -> str | None:
    """Why a redis:// or rediss:// URL's port or database does not parse; None when they do."""
    parts = urlsplit(url)
    try:
        _ = parts.port
    except ValueError:
        port = parts.netloc.rpartition(":")[2]
        host = parts.hostname or "127.0.0.1"
        return f"ARLOOP_REDIS_URL: the port {port!r} is not a number, e.g. redis://{host}:6379/0"
    db = parts.path.strip("/")
    if db and not db.isdigit():
        return f"ARLOOP_REDIS_URL: the database {db!r} is not a number: end the URL with /0"
    return None


def sync_client(url: str, s: RedisSettings, **extra: Any) -> redis.Redis:
    """A blocking client for `url` with the settings' credentials, TLS, checks and retries
    (a cluster client with `redis_cluster`)."""
    if s.redis_cluster:
        return redis.cluster.RedisCluster.from_url(url, **(options(s, url) | extra))  # type: ignore[return-value]
    return redis.Redis.from_url(url, **(options(s, url) | extra))


def async_client(url: str, s: RedisSettings, **extra: Any) -> aioredis.Redis:
    """The asyncio twin of `sync_client`."""
    if s.redis_cluster:
        kw = options(s, url, asyncio=True) | extra
        return aiocluster.RedisCluster.from_url(url, **kw)  # type: ignore[return-value]
    return aioredis.from_url(url, **(options(s, url, asyncio=True) | extra))


class RedisModeMismatch(RuntimeError):
    """ARLOOP_REDIS_CLUSTER says one thing and the server at ARLOOP_REDIS_URL another."""


def check_mode(url: str | None, s: RedisSettings) -> None:
    """At a process's start: RedisModeMismatch naming the fix when the server at `url` is (or is
    not) a cluster node against `redis_cluster`; a server that does not answer is left to the
    process's own retries and health check."""
    if not url:
        return
    timeouts = {"socket_connect_timeout": 2.0, "socket_timeout": 2.0}
    plain = options(s, url) | timeouts | {"retry": None}
    try:
        with redis.Redis.from_url(url, **plain) as client:
            why = cluster_mismatch(client, s.redis_cluster)
    except redis.RedisError:
        return
    if why:
        raise RedisModeMismatch(why)


class StreamShardsMismatch(RedisModeMismatch):
    """ARLOOP_STREAM_SHARDS differs from the count the streams were laid out with."""


def claim_shards(client: Any, shards: StreamShards) -> None:
    """At a process's start: record the streams' shard count when none is recorded yet, else
    StreamShardsMismatch naming the fix when `shards` is another count."""
    client.set(STREAM_SHARDS_KEY, shards.count, nx=True)
    why = check_shards(client.get(STREAM_SHARDS_KEY), shards)
    if why:
        raise StreamShardsMismatch(why)


def claim_shards_at(url: str, s: RedisSettings, shards: StreamShards) -> None:
    """`claim_shards` with a short-lived client at a process's start; a server that does not
    answer yet is left to the process's own retries (the streams are checked at its next start)."""
    timeouts = {"socket_connect_timeout": 2.0, "socket_timeout": 2.0, "retry": None}
    try:
        client = sync_client(url, s, **timeouts)
        try:
            claim_shards(client, shards)
        finally:
            client.close()
    except redis.RedisError:
        return


def cluster_mismatch(client: Any, cluster: bool) -> str | None:
    """Why the server behind a connected sync `client` does not match `cluster` mode; None when
    it does (asks the server's INFO)."""
    enabled = bool(int(_info(client).get("cluster_enabled", 0)))
    if cluster and not enabled:
        return (
            "ARLOOP_REDIS_CLUSTER=true but the Redis at ARLOOP_REDIS_URL is not a cluster "
            "(cluster_enabled:0): unset ARLOOP_REDIS_CLUSTER, or point the URL at a cluster node"
        )
    if enabled and not cluster:
        return (
            "the Redis at ARLOOP_REDIS_URL is a cluster node: set ARLOOP_REDIS_CLUSTER=true "
            "(a plain client would fail on the first key another node holds, with MOVED)"
        )
    return None


def _info(client: Any) -> dict[str, Any]:
    if isinstance(client, redis.cluster.RedisCluster):
        return client.info("cluster", target_nodes=redis.cluster.RedisCluster.RANDOM)
    return client.info("cluster")


class RedisUnreachable(RuntimeError):
    """The Redis at ARLOOP_REDIS_URL does not answer, or refuses this process's credentials;
    the message names where and the fix."""


def where(url: str) -> str:
    """`host:port` (or the socket's path) of a Redis URL, never its credentials."""
    parts = urlsplit(url)
    if parts.scheme == "unix":
        return parts.path
    return f"{parts.hostname or '127.0.0.1'}:{parts.port or 6379}"


def not_answering(url: str, s: RedisSettings) -> str | None:
    """Why the Redis at `url` does not answer a PING now (one quick try); None when it does.
    RedisUnreachable when it answers but refuses the credentials: waiting will not help."""
    timeouts = {"socket_connect_timeout": 2.0, "socket_timeout": 2.0}
    try:
        with redis.Redis.from_url(url, **(options(s, url) | timeouts | {"retry": None})) as r:
            r.ping()
    except (redis.AuthenticationError, redis.exceptions.NoPermissionError) as exc:
        raise RedisUnreachable(
            f"the Redis at {where(url)} refuses this process's credentials ({exc}): fix the "
            "user and password in ARLOOP_REDIS_URL (or ARLOOP_REDIS_USERNAME, ARLOOP_REDIS_PASSWORD)"
        ) from None
    except redis.ResponseError as exc:
        if "NOAUTH" not in str(exc):
            return None  # it answered; the command's own error is the process's to meet
        raise RedisUnreachable(
            f"the Redis at {where(url)} needs a password: put it in ARLOOP_REDIS_URL "
            "(redis://<user>:<password>@host:6379/0) or ARLOOP_REDIS_PASSWORD"
        ) from None
    except redis.RedisError as exc:
        return str(exc).rstrip(".") or type(exc).__name__
    return None


def wait_for(
    url: str,
    s: RedisSettings,
    say: Callable[[str], None],
    *,
    until: str,
    wait: bool = True,
    background: bool = False,
    every_s: float = 1.0,
) -> None:
    """At a process's start: return at once when the Redis at `url` answers; else say so in
    one line (`until`: what the process does meanwhile) and wait until it does (`background`:
    in a thread, saying when it answers), or with `wait=False` raise RedisUnreachable."""
    why = not_answering(url, s)
    if why is None:
        return
    if not wait:
        raise RedisUnreachable(
            f"the Redis at {where(url)} does not answer ({why}): start it, or fix ARLOOP_REDIS_URL"
        )
    say(f"waiting for Redis at {where(url)} ({why}); {until}")

    def answered() -> None:
        try:
            while not_answering(url, s) is not None:
                time.sleep(every_s)
        except RedisUnreachable as exc:  # up now, but refusing these credentials
            say(str(exc))
            return
        say(f"Redis at {where(url)} answers")

    if background:
        threading.Thread(target=answered, name="redis-wait", daemon=True).start()
    else:
        answered()
