"""The learner's exactly-once ledger across a Redis Cluster master's kill -9, with sharded
streams: a 3-master cluster with one replica each on loopback (deploy/manifests/redis.conf's
persistence: AOF, fsync every second), feedback accepted through the real intake
(`FeedbackIntake`, the code behind `POST /v1/feedback`) into 3 shards while the learner's real
source (`TrajectorySource`) reads every shard into its store; then kill -9 of the master that
holds shard 0, its replica promoted by the cluster itself (`cluster-node-timeout`), the load
and the learner going on through the failover.

Reported: feedback acknowledged (the intake returned its id: a 202), refused during the
failover (an error the client saw: nothing acknowledged), stored by the learner (once: the
store's key is the event id), lost (acknowledged, never stored: asynchronous replication's
window), stored though the client saw an error (written, then the reply was lost: a retry
gets 409), and entries delivered again after the failover that the ledger recognised and did
not count again (the group's position on the promoted replica lagged).

    .venv/bin/python bench/bench_cluster_failover.py [--trials 3] [--writers 16] [--load-s 6]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import redis
from redis.asyncio.cluster import RedisCluster as AsyncCluster
from redis.cluster import RedisCluster
from redis.crc import key_slot

from agents.events import StreamShards
from agents.feedback_intake import FeedbackIntake, FeedbackRejected, FeedbackSubmission
from agents.feedback_tokens import issue
from learner.store import Store
from learner.trajectory_source import TrajectorySource
from tests.redis_cluster import CLI, SERVER, _free_port, _wait

CONF = ROOT / "deploy" / "manifests" / "redis.conf"
SECRET = "bench-secret-" + "x" * 32
SHARDS = StreamShards(3)


@dataclass
class Trial:
    acknowledged: set[str] = field(default_factory=set)
    refused: int = 0
    stored: int = 0
    lost: int = 0
    unacknowledged: int = 0
    duplicates: int = 0
    failover_s: float = 0.0


def start_cluster(directory: Path, node_timeout_ms: int) -> list[tuple[subprocess.Popen, int]]:
    """Six nodes (3 masters, 3 replicas) with the manifest's persistence, joined."""
    ports: set[int] = set()
    while len(ports) < 6:  # a port is free until its server binds it: ask until six differ
        ports.add(_free_port())
    nodes = []
    for port in sorted(ports):
        data = directory / str(port)
        data.mkdir()
        args = [str(SERVER), str(CONF), "--port", str(port), "--bind", "127.0.0.1"]
        args += ["--dir", str(data), "--cluster-enabled", "yes", "--protected-mode", "no"]
        args += ["--cluster-node-timeout", str(node_timeout_ms)]
        args += ["--cluster-config-file", "nodes.conf", "--daemonize", "no"]
        log = open(data / "redis.log", "w")  # noqa: SIM115 - lives with the process
        nodes.append((subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT), port))
    for _, port in nodes:
        _wait(lambda p=port: redis.Redis(port=p).ping(), 15, f"node {port} did not answer")
    hosts = [f"127.0.0.1:{p}" for _, p in nodes]
    subprocess.run(
        [CLI, "--cluster", "create", *hosts, "--cluster-replicas", "1", "--cluster-yes"],
        check=True,
        capture_output=True,
        timeout=60,
    )
    for _, port in nodes:
        _wait(
            lambda p=port: redis.Redis(port=p).cluster("info")["cluster_state"] == "ok",
            30,
            f"node {port} never reported cluster_state:ok",
        )
    for _, port in nodes:  # a replica still on its first sync could not take over
        _wait(lambda p=port: _synced(p), 60, f"replica {port} never finished its first sync")
    return nodes


def _synced(port: int) -> bool:
    info = redis.Redis(port=port).info("replication")
    return info["role"] == "master" or info.get("master_link_status") == "up"


async def write(url: str, trial: Trial, stop: threading.Event, base: int, writers: int) -> None:
    client = AsyncCluster.from_url(url, socket_timeout=2)
    intake = FeedbackIntake(client, SECRET, 10**9, shards=SHARDS)

    async def one(w: int) -> None:
        i = 0
        while not stop.is_set():
            run = f"traj_{base + w:04d}_{i:08d}"
            i += 1
            token = issue(SECRET, run, f"user{w}", "v0", 3600)
            try:
                trial.acknowledged.add(
                    await intake.accept(FeedbackSubmission(run, token, "thumbs", 1))
                )
            except (redis.RedisError, FeedbackRejected, OSError):
                trial.refused += 1
                await asyncio.sleep(0.05)

    await asyncio.gather(*(one(w) for w in range(writers)))
    await client.aclose()


def learn(url: str, path: Path, trial: Trial, stop: threading.Event) -> None:
    """The learner's source polling every shard until `stop`, then until caught up."""
    client = RedisCluster.from_url(url, socket_timeout=2)
    store = Store(path)
    source = TrajectorySource(
        client, store, "bench", block_ms=50, claim_idle_ms=1000, shards=SHARDS
    )
    source.ensure_groups()
    caught_up = False
    while not (stop.is_set() and caught_up):
        try:
            result = source.poll()
        except (redis.RedisError, OSError):
            time.sleep(0.2)  # the failover: the cluster client finds the promoted replica
            caught_up = False
            continue
        trial.duplicates += result.duplicates
        caught_up = result.caught_up and source.pending() == 0
    client.close()
    store.close()


def run_trial(base: Path, opts, k: int) -> Trial:
    directory = base / f"trial-{k}"
    directory.mkdir()
    nodes = start_cluster(directory, opts.node_timeout_ms)
    url = f"redis://127.0.0.1:{nodes[0][1]}"
    trial = Trial()
    path = directory / "store.db"
    try:
        with RedisCluster.from_url(url) as c:
            victim_name = c.get_node_from_key(SHARDS.feedback(0)).name
        victim, victim_port = next((p, n) for p, n in nodes if victim_name.endswith(f":{n}"))
        stop = threading.Event()
        learner = threading.Thread(target=learn, args=(url, path, trial, stop), daemon=True)
        learner.start()
        writer = threading.Thread(
            target=lambda: asyncio.run(write(url, trial, stop, k * 1000, opts.writers)),
            daemon=True,
        )
        writer.start()
        time.sleep(opts.load_s / 3)
        killed = time.monotonic()
        victim.send_signal(signal.SIGKILL)
        _wait(lambda: _promoted(nodes, victim_port), 60, "no replica was promoted")
        trial.failover_s = time.monotonic() - killed
        time.sleep(opts.load_s * 2 / 3)
        stop.set()
        writer.join(timeout=60)
        learner.join(timeout=120)
        store = Store(path)
        ids = store_ids(store)
        store.close()
        trial.stored = len(ids & trial.acknowledged)
        trial.lost = len(trial.acknowledged - ids)
        trial.unacknowledged = len(ids - trial.acknowledged)
        return trial
    finally:
        for proc, _ in nodes:
            if proc.poll() is None:
                proc.terminate()
                proc.wait(timeout=10)


def _promoted(nodes: list[tuple[subprocess.Popen, int]], victim_port: int) -> bool:
    """Shard 0's slot is served again, by a node other than the one killed."""
    slot = key_slot(SHARDS.feedback(0).encode())
    for proc, port in nodes:
        if port == victim_port or proc.poll() is not None:
            continue
        try:
            r = redis.Redis(port=port, socket_timeout=1)
            if r.cluster("info")["cluster_state"] != "ok":
                return False
            for start, end, master, *_ in r.execute_command("CLUSTER SLOTS"):
                if start <= slot <= end:
                    return int(master[1]) != victim_port
        except redis.RedisError:
            return False
    return False


def store_ids(store: Store) -> set[str]:
    rows = store.db.execute("SELECT event_id FROM feedback").fetchall()
    return {r[0] for r in rows}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--writers", type=int, default=16)
    parser.add_argument("--load-s", type=float, default=6.0)
    parser.add_argument("--node-timeout-ms", type=int, default=1000)
    opts = parser.parse_args()
    if not SERVER.exists() or CLI is None:
        sys.exit("redis-server and redis-cli are needed: apt-get install -y redis-server")
    base = Path(tempfile.mkdtemp(prefix="arloop-cluster-failover-"))
    print(
        f"cpus: {os.cpu_count()}, load average: {os.getloadavg()[0]:.2f}; 3 masters + 3 "
        f"replicas, cluster-node-timeout {opts.node_timeout_ms} ms, {SHARDS.count} shards, "
        f"{opts.writers} writers, {opts.load_s} s of load a trial, kill -9 of shard 0's master"
    )
    for k in range(opts.trials):
        t = run_trial(base, opts, k)
        print(
            f"trial {k}: acknowledged {len(t.acknowledged)}, refused during the failover "
            f"{t.refused}, stored {t.stored}, lost {t.lost}, stored though the client saw an "
            f"error {t.unacknowledged}, "
            f"delivered again and recognised by the ledger {t.duplicates}, replica promoted "
            f"after {t.failover_s:.1f} s"
        )


if __name__ == "__main__":
    main()
