"""Feedback ingest past one Redis core: the intake (`FeedbackIntake.accept`, the code behind
`POST /v1/feedback`: token check, rate window, replay marker, XADD) on one plain Redis against a
3-master Redis Cluster with 1, 2 and 3 stream shards (ARLOOP_STREAM_SHARDS), same run.

Each setup gets the same load: `--workers` client processes, each with `--concurrency`
accepts in flight, every accept a fresh run with a valid token (pre-issued, outside the clock).
Reported per setup: accepted events/s, accept latency p50 / p99, and the Redis CPU each event
cost on the busiest master: all of it (INFO's used_cpu_user + used_cpu_sys, before and after:
at a load that does not fill the core, this includes a wakeup per few commands) and the part
spent running commands (INFO commandstats): the figures that say how far ingest goes before one
Redis core is full, whatever the client machine. The
servers run without persistence (`--save ""`, `--appendonly no`), all alike. Rounds alternate
between the setups, so a machine whose load moves hits all of them alike; medians are reported.

    .venv/bin/python bench/bench_sharded_ingest.py [--events 4000] [--workers 2] [--rounds 3]

On a 2-core machine the client processes and the servers share the cores: the events/s say
little about a real deployment, the CPU per event on the busiest master says how it divides.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import redis
import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster as AsyncCluster
from redis.cluster import RedisCluster

from agents.events import StreamShards
from agents.feedback_intake import _ACCEPT, FeedbackIntake, FeedbackSubmission
from agents.feedback_tokens import issue
from bench.bench_feedback_ingest import _sample_fields, redis_benchmark
from tests.redis_cluster import SERVER, _free_port, _wait, start_cluster

SECRET = "bench-secret-" + "x" * 32


@dataclass(frozen=True)
class Setup:
    name: str
    url: str
    cluster: bool
    shards: int
    ports: tuple[int, ...]


def worker(setup: Setup, first: int, events: int, concurrency: int, start_at: float) -> dict:
    """Accept `events` fresh feedbacks; counts, seconds and each accept's latency."""
    subs = [
        FeedbackSubmission(
            f"traj_{first + i:012d}",
            issue(SECRET, f"traj_{first + i:012d}", f"user{(first + i) % 500}", "v0", 3600),
            "thumbs",
            1,
        )
        for i in range(events)
    ]
    return asyncio.run(_accept_all(setup, subs, concurrency, start_at))


async def _accept_all(
    setup: Setup, subs: list[FeedbackSubmission], concurrency: int, start_at: float
) -> dict:
    client = AsyncCluster.from_url(setup.url) if setup.cluster else aioredis.from_url(setup.url)
    intake = FeedbackIntake(
        client, SECRET, 10**9, shards=StreamShards(setup.shards), max_entries=200_000
    )
    await intake.accept(subs[0])  # connections and scripts warm before the clock
    queue = iter(subs[1:])
    latencies: list[float] = []

    async def one() -> None:
        for sub in queue:
            began = time.perf_counter()
            await intake.accept(sub)
            latencies.append(time.perf_counter() - began)

    await asyncio.sleep(max(0.0, start_at - time.time()))
    began = time.time()
    await asyncio.gather(*(one() for _ in range(concurrency)))
    ended = time.time()
    await client.aclose()
    return {"accepted": len(latencies), "began": began, "ended": ended, "latencies": latencies}


def redis_cpu(ports: tuple[int, ...]) -> list[tuple[float, float]]:
    """(CPU seconds each server has used so far, seconds spent in commands: INFO commandstats)."""
    out = []
    for port in ports:
        with redis.Redis(port=port) as r:
            cpu = r.info("cpu")
            commands = sum(c["usec"] for c in r.info("commandstats").values()) / 1e6
            out.append((float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"]), commands))
    return out


def measure(setup: Setup, pool: ProcessPoolExecutor, opts, offset: int) -> dict:
    """One round of one setup: every worker at once."""
    before = redis_cpu(setup.ports)
    start_at = time.time() + 1.5  # the workers issue their tokens first
    per = opts.events // opts.workers
    futures = [
        pool.submit(worker, setup, offset + w * per, per, opts.concurrency, start_at)
        for w in range(opts.workers)
    ]
    results = [f.result() for f in futures]
    after = redis_cpu(setup.ports)
    cpu = [b[0] - a[0] for a, b in zip(before, after, strict=True)]
    commands = [b[1] - a[1] for a, b in zip(before, after, strict=True)]
    accepted = sum(r["accepted"] for r in results)
    seconds = max(r["ended"] for r in results) - min(r["began"] for r in results)
    latencies = sorted(x for r in results for x in r["latencies"])
    return {
        "rate": accepted / seconds,
        "p50": latencies[len(latencies) // 2] * 1000,
        "p99": latencies[int(len(latencies) * 0.99)] * 1000,
        "busiest_us": max(cpu) / accepted * 1e6,
        "all_us": sum(cpu) / accepted * 1e6,
        "commands_us": max(commands) / accepted * 1e6,
        "shares": [c / sum(cpu) for c in cpu] if sum(cpu) else [],
    }


def start_plain(directory: Path) -> tuple[subprocess.Popen, int]:
    port = _free_port()
    args = [str(SERVER), "--port", str(port), "--bind", "127.0.0.1", "--dir", str(directory)]
    proc = subprocess.Popen([*args, "--save", "", "--appendonly", "no"], stdout=subprocess.DEVNULL)
    _wait(lambda: redis.Redis(port=port).ping(), 15, f"redis-server on {port} did not answer")
    return proc, port


def masters_of(cluster_url: str, shards: StreamShards) -> list[str]:
    """The master (host:port) holding each shard's feedback stream."""
    with RedisCluster.from_url(cluster_url) as c:
        return [c.get_node_from_key(s).name for s in shards.all_feedback()]


def ceilings(port: int, masters: int) -> dict[str, float]:
    """What one Redis core takes when it is the bottleneck (redis-benchmark, 50 clients, fresh
    keys each call, median of 3), and the events/s each setup reaches before its busiest master
    is full, its share of the work even (the end-to-end shares above say how even)."""
    keys = ["b:rate:u__rand_int__", "b:seen:t__rand_int__", "b:intake", "b:krate", "b:scores"]
    fields = ["3600", "fb___rand_int__", "0", "0", "200000", *_sample_fields()]
    script = ["EVAL", _ACCEPT, "5", *keys]

    def median(*command: str) -> float:  # of 3 runs
        return statistics.median(redis_benchmark(port, 100_000, 50, *command) for _ in range(3))

    one = median(*script, "1000000000", "120", *fields)
    sharded = median(*script, "-1", "120", *fields)
    windows = median("INCR", "b:w__rand_int__")
    out = {"script, rate windows inside (1 shard)": one, "script, windows counted before": sharded}
    out["INCR of a user's window (N > 1)"] = windows
    for n in range(1, masters + 1):  # the busiest master's share: 1/n of the scripts, 1/masters
        load = 1 / one if n == 1 else 1 / (n * sharded) + 1 / (masters * windows)  # of windows
        out[f"ceiling, {n} shard(s) on {masters} masters"] = 1 / load
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=4000, help="accepts per setup and round")
    parser.add_argument("--workers", type=int, default=2, help="client processes")
    parser.add_argument("--concurrency", type=int, default=32, help="accepts in flight each")
    parser.add_argument("--rounds", type=int, default=3)
    opts = parser.parse_args()
    if not SERVER.exists():
        sys.exit(f"{SERVER} is missing: apt-get install -y redis-server")
    work = Path(tempfile.mkdtemp(prefix="arloop-shards-"))
    (work / "plain").mkdir()
    (work / "cluster").mkdir()
    plain, plain_port = start_plain(work / "plain")
    cluster = start_cluster(work / "cluster")
    setups = [
        Setup("plain Redis, 1 shard", f"redis://127.0.0.1:{plain_port}", False, 1, (plain_port,))
    ]
    setups += [
        Setup(f"cluster, {n} shard{'s' * (n > 1)}", cluster.url, True, n, tuple(cluster.ports))
        for n in (1, 2, 3)
    ]
    runs: dict[str, list[dict]] = {s.name: [] for s in setups}
    try:
        with ProcessPoolExecutor(opts.workers) as pool:
            for k in range(opts.rounds):
                for i, setup in enumerate(setups):
                    offset = (k * len(setups) + i) * 10 * opts.events
                    runs[setup.name].append(measure(setup, pool, opts, offset))
        print(
            f"cpus: {os.cpu_count()}, load average: {os.getloadavg()[0]:.2f}; {opts.workers} "
            f"client processes x {opts.concurrency} in flight, {opts.events} accepts per setup "
            f"and round, {opts.rounds} rounds alternated (medians); Redis {redis_version(plain_port)}"
        )
        for n in (1, 2, 3):
            print(
                f"  {n} shard(s) on the cluster: masters {masters_of(cluster.url, StreamShards(n))}"
            )
        base = None
        for setup in setups:
            rs = runs[setup.name]
            med = {key: statistics.median(r[key] for r in rs) for key in rs[0] if key != "shares"}
            shares = max(rs, key=lambda r: r["busiest_us"])["shares"]
            base = base or med
            print(
                f"{setup.name:22s} {med['rate']:8,.0f} events/s ({med['rate'] / base['rate']:.2f}x)"
                f"  p50 {med['p50']:6.1f} ms  p99 {med['p99']:6.1f} ms  Redis CPU/event: busiest "
                f"master {med['busiest_us']:5.1f} us ({med['busiest_us'] / base['busiest_us']:.2f}x),"
                f" all {med['all_us']:5.1f} us; in commands, busiest {med['commands_us']:4.1f} us "
                f"({med['commands_us'] / base['commands_us']:.2f}x); shares "
                f"{[f'{s:.2f}' for s in shares]}"
            )
        print("Redis side alone, one core saturated by redis-benchmark (events/s):")
        for name, rate in ceilings(plain_port, len(cluster.ports)).items():
            print(f"  {name:45s} {rate:10,.0f}")
    finally:
        cluster.stop()
        plain.terminate()
        plain.wait(timeout=10)


def redis_version(port: int) -> str:
    with redis.Redis(port=port) as r:
        return r.info("server")["redis_version"]


if __name__ == "__main__":
    main()
