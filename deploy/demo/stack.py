"""The demo's processes: embedded Redis, `arloop serve policy`, `arloop serve agents`, `arloop learn`.

Each runs as its own OS process with its settings in `ARLOOP_*` variables, exactly as a user
would start them, its output going to `<data dir>/logs/<name>.log`. `stop()` ends them in
reverse order (SIGTERM, then SIGKILL after a grace period) and shuts Redis down; it is safe
to call twice and runs on Ctrl-C too.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from deploy.embedded_redis import RedisProcess, free_port, start_redis

# `arloop <args>` without relying on the console script being on PATH.
_CLI = "from deploy.cli import app; app()"


class StackError(RuntimeError):
    """A process of the stack did not start or died; the message quotes its log."""


@dataclass
class Proc:
    name: str
    process: subprocess.Popen
    log: Path

    def tail(self, lines: int = 15) -> str:
        try:
            text = self.log.read_text(errors="replace").splitlines()
        except OSError:
            return ""
        return "\n".join(text[-lines:])


@dataclass
class Stack:
    """The four processes of one demo, in one data directory."""

    data_dir: Path
    env: dict[str, dict[str, str]]
    """Extra environment per process: `policy`, `agents`, `learn`."""
    redis: RedisProcess | None = None
    procs: list[Proc] = field(default_factory=list)
    policy_port: int = field(default_factory=free_port)
    agents_port: int = field(default_factory=free_port)
    learn_metrics_port: int = field(default_factory=free_port)

    @property
    def logs(self) -> Path:
        return self.data_dir / "logs"

    @property
    def policy_url(self) -> str:
        return f"http://127.0.0.1:{self.policy_port}/v1"

    @property
    def agents_url(self) -> str:
        return f"http://127.0.0.1:{self.agents_port}"

    def start_redis(self) -> str:
        self.logs.mkdir(parents=True, exist_ok=True)
        self.redis = start_redis(self.data_dir / "redis")
        return self.redis.url

    def start(self, names: tuple[str, ...] = ("policy", "agents", "learn")) -> None:
        """The arloop processes `names` at once (their imports overlap); all three by default."""
        base = {
            "ARLOOP_REDIS_URL": self.redis.url,
            "ARLOOP_DATA_DIR": str(self.data_dir),
            "ARLOOP_LOG_LEVEL": "WARNING",
            "ARLOOP_LOG_FORMAT": "text",  # the demo's log files are read by people
        }
        ports = {"policy": self.policy_port, "agents": self.agents_port}
        commands = {
            "policy": ["serve", "policy"],
            "agents": ["serve", "agents"],
            "learn": ["learn"],
        }
        for name, args in commands.items():
            if name not in names:
                continue
            extra = {f"ARLOOP_{name.upper()}_PORT": str(ports[name])} if name in ports else {}
            if name == "learn":
                extra = {"ARLOOP_METRICS_PORT": str(self.learn_metrics_port)}
            self._spawn(name, args, base | extra | self.env.get(name, {}))

    def _spawn(self, name: str, args: list[str], env: dict[str, str]) -> None:
        log = self.logs / f"{name}.log"
        out = open(log, "ab")  # noqa: SIM115 - the child writes to it until it ends
        proc = subprocess.Popen(
            [sys.executable, "-c", _CLI, *args],
            env=os.environ | env,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        out.close()
        self.procs.append(Proc(name, proc, log))

    def wait_ready(self, timeout_s: float, tick=lambda: None) -> None:
        """Until the started policy server and agent API answer /healthz (StackError
        otherwise)."""
        deadline = time.monotonic() + timeout_s
        started = {p.name for p in self.procs}
        urls = {"policy": f"{self.policy_url[:-3]}/healthz", "agents": f"{self.agents_url}/healthz"}
        pending = {name: url for name, url in urls.items() if name in started}
        while pending:
            self.check_alive()
            for name, url in list(pending.items()):
                if _healthy(url):
                    del pending[name]
            if time.monotonic() > deadline:
                raise StackError(
                    f"{', '.join(pending)} not up after {timeout_s:.0f} s; see {self.logs}"
                )
            tick()
            time.sleep(0.3)

    def check_alive(self) -> None:
        """StackError naming a process that exited, with the end of its log."""
        for p in self.procs:
            code = p.process.poll()
            if code is not None:
                raise StackError(
                    f"`arloop {p.name}` exited with code {code}; the end of {p.log}:\n{p.tail()}"
                )

    def stop(self, grace_s: float = 20.0) -> None:
        """Stop every process (newest first), then Redis; idempotent. A second Ctrl-C while
        this runs is ignored: interrupting it would leave the processes running."""
        main_thread = threading.current_thread() is threading.main_thread()
        previous = signal.signal(signal.SIGINT, signal.SIG_IGN) if main_thread else None
        try:
            self._stop(grace_s)
        finally:
            if main_thread:
                signal.signal(signal.SIGINT, previous)

    def stop_process(self, name: str, grace_s: float = 20.0) -> None:
        """Stop one process (SIGTERM, SIGKILL after `grace_s`); the others keep running."""
        mine = [p for p in self.procs if p.name == name]
        _terminate(mine, grace_s)
        self.procs = [p for p in self.procs if p.name != name]

    def _stop(self, grace_s: float) -> None:
        _terminate(list(reversed(self.procs)), grace_s)
        self.procs = []
        if self.redis is not None:
            self.redis.stop()
            self.redis = None


def _terminate(procs: list[Proc], grace_s: float) -> None:
    """SIGTERM to each, then wait for all, with SIGKILL for any still alive after `grace_s`."""
    for p in procs:
        if p.process.poll() is None:
            _signal(p.process, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    for p in procs:
        try:
            p.process.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            _signal(p.process, signal.SIGKILL)
            p.process.wait()


def _signal(process: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(process.pid, sig)  # its own session: the process and anything it started
    except ProcessLookupError:
        pass


def _healthy(url: str) -> bool:
    try:
        return httpx.get(url, timeout=1.0).status_code == 200
    except httpx.HTTPError:
        return False
