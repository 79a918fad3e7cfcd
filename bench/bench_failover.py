"""What a Redis failover loses of acknowledged feedback, with deploy/manifests/redis.conf (AOF,
fsync every second) on loopback: kill -9 the primary under load, promote the replica with
`REPLICAOF NO ONE`, and count the feedback events arloop acknowledged that the new primary
does not have.

The load goes through `agents.feedback_intake.FeedbackIntake` (the code behind
`POST /v1/feedback`: token check, rate window, replay marker and XADD in one Lua call), from
`--writers` connections, each a valid token for a new trajectory. An event counts as
acknowledged when `accept()` returned its id (the API would have answered 202). Scenarios,
each `--trials` times:

  process    kill -9 of the primary process; the replica is linked to it directly, so what
             the primary wrote to its sockets still arrives (the kernel sends it)
  host       the replica's link passes through a proxy that delays primary->replica bytes by
             `--link-ms` (a replica in another zone); at the kill the proxy drops what is in
             flight, as a lost host or network would
  host+WAIT  as `host`, but each accept is followed by `WAIT 1 <ms>` on its connection and
             counts only once a replica has it
  restart    no failover: kill -9 and restart the same primary from its append-only file

    .venv/bin/python bench/bench_failover.py [--trials 3] [--writers 16] [--load-s 3]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import redis
import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from agents.events import FEEDBACK_SEEN_PREFIX, STREAM_FEEDBACK
from agents.feedback_intake import FeedbackIntake, FeedbackSubmission
from agents.feedback_tokens import issue
from deploy.embedded_redis import free_port, redis_server_binary

CONF = ROOT / "deploy" / "manifests" / "redis.conf"
SECRET = "bench-secret-" + "x" * 32
SCENARIOS = ("process", "host", "host+WAIT", "restart")


class DelayProxy:
    """A TCP relay for the replica's link: primary->replica bytes arrive `delay` s late
    (replica->primary at once); `crash()` drops what is in flight and refuses reconnects."""

    def __init__(self, upstream_port: int, delay: float) -> None:
        self.upstream_port, self.delay = upstream_port, delay
        self.server: asyncio.Server | None = None
        self.transports: list[asyncio.WriteTransport] = []
        self.tasks: list[asyncio.Task] = []

    async def start(self) -> int:
        self.server = await asyncio.start_server(self._relay, "127.0.0.1", 0)
        return self.server.sockets[0].getsockname()[1]

    async def _relay(self, down_r: asyncio.StreamReader, down_w: asyncio.StreamWriter) -> None:
        up_r, up_w = await asyncio.open_connection("127.0.0.1", self.upstream_port)
        self.transports += [down_w.transport, up_w.transport]
        queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()
        self.tasks += [
            asyncio.create_task(self._pump(down_r, up_w)),  # replica -> primary
            asyncio.create_task(self._delay_in(up_r, queue)),  # primary -> queue
            asyncio.create_task(self._delay_out(queue, down_w)),  # queue -> replica, late
        ]

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while chunk := await reader.read(65536):
            writer.write(chunk)

    async def _delay_in(self, reader: asyncio.StreamReader, queue: asyncio.Queue) -> None:
        while chunk := await reader.read(65536):
            queue.put_nowait((time.monotonic() + self.delay, chunk))

    async def _delay_out(self, queue: asyncio.Queue, writer: asyncio.StreamWriter) -> None:
        while True:
            due, chunk = await queue.get()
            await asyncio.sleep(max(0.0, due - time.monotonic()))
            writer.write(chunk)

    def crash(self) -> None:
        """The host is gone: bytes not yet delivered are lost, the link is cut at once."""
        for task in self.tasks:
            task.cancel()
        for transport in self.transports:
            transport.abort()  # discards anything buffered
        if self.server is not None:
            self.server.close()


@dataclass
class Trial:
    scenario: str
    acked: set[str] = field(default_factory=set)
    unconfirmed: int = 0  # WAIT timed out: written, never acknowledged
    seconds: float = 0.0
    present: set[str] = field(default_factory=set)
    markers: int = 0

    @property
    def lost(self) -> int:
        return len(self.acked - self.present)


def start_server(directory: Path, *extra: str) -> tuple[subprocess.Popen, int]:
    """redis-server on 127.0.0.1 with the deployment's redis.conf, data in `directory`."""
    directory.mkdir(parents=True, exist_ok=True)
    port = free_port()
    proc = subprocess.Popen(
        [redis_server_binary(), str(CONF), "--port", str(port), "--bind", "127.0.0.1", *extra],
        cwd=directory,  # redis.conf has no `dir`: its files go to the working directory
        stdout=open(directory / "redis.log", "ab"),
        stderr=subprocess.STDOUT,
    )
    with redis.Redis(port=port) as r:
        for _ in range(200):
            try:
                r.ping()
                return proc, port
            except redis.ConnectionError:
                if proc.poll() is not None:
                    sys.exit(f"redis-server exited: see {directory / 'redis.log'}")
                time.sleep(0.05)
    sys.exit(f"redis-server did not answer: see {directory / 'redis.log'}")


def wait_in_sync(port: int) -> None:
    with redis.Redis(port=port, decode_responses=True) as r:
        for _ in range(400):
            info = r.info("replication")
            if info.get("master_link_status") == "up" and not info.get("master_sync_in_progress"):
                return
            time.sleep(0.05)
    sys.exit("the replica did not sync with the primary")


async def writer(port: int, w: int, trial: Trial, stop: asyncio.Event, wait_ms: int | None):
    """Accepts feedback through the intake until the primary is gone (or `stop`)."""
    client = aioredis.Redis(port=port, single_connection_client=True, retry=Retry(NoBackoff(), 0))
    intake = FeedbackIntake(client, SECRET, rate_per_minute=10**9)
    n = 0
    try:
        while not stop.is_set():
            trajectory, user = f"traj_{trial.scenario}_{w}_{n}", f"user{w}"
            token = issue(SECRET, trajectory, user, "v0", 3600)
            sub = FeedbackSubmission(trajectory, token, "thumbs", 1.0, user_id=user)
            event_id = await intake.accept(sub)
            n += 1
            if wait_ms is not None and await client.execute_command("WAIT", 1, wait_ms) < 1:
                trial.unconfirmed += 1
                continue
            trial.acked.add(event_id)
    except (redis.RedisError, OSError):
        pass  # the primary died: this writer's in-flight call was never acknowledged
    finally:
        try:
            await client.aclose()
        except (redis.RedisError, OSError):
            pass


async def load_and_kill(scenario: str, primary: subprocess.Popen, port: int, opts, proxy):
    """Writers for `--load-s`, then the crash; the trial with what was acknowledged."""
    trial = Trial(scenario)
    stop = asyncio.Event()
    wait_ms = opts.wait_ms if scenario == "host+WAIT" else None
    tasks = [
        asyncio.create_task(writer(port, w, trial, stop, wait_ms)) for w in range(opts.writers)
    ]
    started = time.perf_counter()
    await asyncio.sleep(opts.load_s)
    if proxy is not None:
        proxy.crash()  # in the same instant as the kill: no await between the two
    os.kill(primary.pid, signal.SIGKILL)
    trial.seconds = time.perf_counter() - started
    await asyncio.sleep(0.5)
    stop.set()
    await asyncio.gather(*tasks)
    primary.wait()
    return trial


def read_back(port: int, trial: Trial) -> None:
    """The event ids and replay markers the surviving server holds."""
    with redis.Redis(port=port) as r:
        entries = r.xrange(STREAM_FEEDBACK)
        trial.present = {fields[b"event_id"].decode() for _, fields in entries}
        trial.markers = sum(1 for _ in r.scan_iter(f"{FEEDBACK_SEEN_PREFIX}:*", count=1000))


def run_trial(scenario: str, base: Path, opts) -> Trial:
    primary, port = start_server(base / "primary")
    replica = proxy = None
    loop = asyncio.new_event_loop()
    try:
        if scenario != "restart":
            upstream = port
            if scenario.startswith("host"):
                proxy = DelayProxy(port, opts.link_ms / 1000)
                upstream = loop.run_until_complete(proxy.start())
            replica, replica_port = start_server(
                base / "replica", "--replicaof", "127.0.0.1", str(upstream)
            )
            loop.run_until_complete(asyncio.to_thread(wait_in_sync, replica_port))
        trial = loop.run_until_complete(load_and_kill(scenario, primary, port, opts, proxy))
        if scenario == "restart":
            primary, port = start_server(base / "primary")  # loads the append-only file
            read_back(port, trial)
        else:
            with redis.Redis(port=replica_port) as r:
                r.execute_command("REPLICAOF", "NO", "ONE")
            read_back(replica_port, trial)
        return trial
    finally:
        loop.close()
        for proc in (primary, replica):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--writers", type=int, default=16)
    parser.add_argument("--load-s", type=float, default=3.0)
    parser.add_argument("--link-ms", type=float, default=2.0)
    parser.add_argument("--wait-ms", type=int, default=1000)
    parser.add_argument("--scenarios", nargs="+", choices=SCENARIOS, default=list(SCENARIOS))
    opts = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="arloop-failover-"))
    print(
        f"cpus: {os.cpu_count()}, load average: {os.getloadavg()[0]:.2f}; "
        f"{redis_server_binary()}; {opts.writers} writers, {opts.load_s:g} s of load a trial, "
        f"replica link delay {opts.link_ms:g} ms (host scenarios)"
    )
    print(
        f"{'scenario':<11} {'trial':>5} {'acked':>7} {'acked/s':>8} {'lost':>5} "
        f"{'lost ms':>7} {'unacked in':>10} {'markers=entries':>15}"
    )
    for scenario in opts.scenarios:
        trials = [run_trial(scenario, work / f"{scenario}-{i}", opts) for i in range(opts.trials)]
        for i, t in enumerate(trials):
            rate = len(t.acked) / t.seconds
            print(
                f"{scenario:<11} {i:>5} {len(t.acked):>7} {rate:>8,.0f} {t.lost:>5} "
                f"{1000 * t.lost / rate:>7.1f} {len(t.present - t.acked):>10} "
                f"{str(t.markers == len(t.present)):>15}"
                + (f"  ({t.unconfirmed} WAIT timeouts)" if t.unconfirmed else "")
            )
        acked = sum(len(t.acked) for t in trials)
        lost = sum(t.lost for t in trials)
        print(f"{scenario:<11} {'all':>5} {acked:>7} {'':>8} {lost:>5}  ({lost / acked:.3%})")
    print(
        "lost: acknowledged, missing after the failover (lost ms: that many ms of acknowledged "
        "writes); unacked in: there, never acknowledged; markers=entries: every replay marker "
        "has its event and none is missing (the intake's Lua call replicates whole)"
    )


if __name__ == "__main__":
    main()
