"""A real 3-master Redis Cluster on loopback for the session (Debian's `/usr/bin/redis-server`,
`--cluster-enabled yes`, joined by `redis-cli --cluster create`), skipped with the reason where
it cannot start; `cluster_url` gives each test an empty cluster."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import redis
from redis.cluster import RedisCluster

SERVER = Path("/usr/bin/redis-server")
CLI = shutil.which("redis-cli", path="/usr/bin") or shutil.which("redis-cli")


@dataclass
class Cluster:
    """Three masters on 127.0.0.1, no replicas."""

    ports: list[int]
    procs: list[subprocess.Popen] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.ports[0]}"

    def client(self) -> RedisCluster:
        return RedisCluster.from_url(self.url)

    def stop(self) -> None:
        for proc in self.procs:
            proc.terminate()
        for proc in self.procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()


def _free_port() -> int:
    """A free port whose cluster bus port (+10000) is free too."""
    for _ in range(50):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port + 10000 >= 65536:
            continue
        with socket.socket() as bus:
            try:
                bus.bind(("127.0.0.1", port + 10000))
            except OSError:
                continue
        return port
    raise OSError("no free port pair (port, port + 10000) on 127.0.0.1")


def _wait(what, timeout: float, why: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if what():
                return
        except (redis.RedisError, OSError):
            pass
        time.sleep(0.1)
    raise TimeoutError(why)


def start_cluster(directory: Path) -> Cluster:
    """Start three cluster-enabled servers and join them (TimeoutError, OSError when it cannot)."""
    ports: set[int] = set()
    while len(ports) < 3:  # a port is free until its server binds it: ask until three differ
        ports.add(_free_port())
    cluster = Cluster(sorted(ports))
    try:
        for port in cluster.ports:
            args = [str(SERVER), "--port", str(port), "--bind", "127.0.0.1"]
            args += ["--cluster-enabled", "yes", "--cluster-config-file", f"nodes-{port}.conf"]
            args += ["--dir", str(directory), "--save", "", "--appendonly", "no"]
            log = open(directory / f"redis-{port}.log", "w")  # noqa: SIM115 - lives with the process
            cluster.procs.append(subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT))
        for port in cluster.ports:
            _wait(lambda p=port: redis.Redis(port=p).ping(), 15, f"node {port} did not answer")
        nodes = [f"127.0.0.1:{p}" for p in cluster.ports]
        subprocess.run(
            [CLI, "--cluster", "create", *nodes, "--cluster-replicas", "0", "--cluster-yes"],
            check=True,
            capture_output=True,
            timeout=60,
        )
        for port in cluster.ports:
            _wait(
                lambda p=port: redis.Redis(port=p).cluster("info")["cluster_state"] == "ok",
                30,
                f"node {port} never reported cluster_state:ok",
            )
        return cluster
    except BaseException:
        cluster.stop()
        raise


@pytest.fixture(scope="session")
def redis_cluster(tmp_path_factory) -> Iterator[Cluster]:
    """The session's cluster (skipped, with the reason, where it cannot start)."""
    if not SERVER.exists() or CLI is None:
        pytest.skip(f"no {SERVER} or redis-cli: cannot start a Redis Cluster (apt install redis)")
    try:
        cluster = start_cluster(tmp_path_factory.mktemp("redis-cluster"))
    except (OSError, TimeoutError, subprocess.SubprocessError) as exc:
        pytest.skip(f"a 3-master Redis Cluster could not start on loopback: {exc}")
    yield cluster
    cluster.stop()


@pytest.fixture
def cluster_url(redis_cluster: Cluster) -> str:
    """The cluster's URL (one node), every master flushed before the test."""
    with redis_cluster.client() as client:
        client.flushall(target_nodes=RedisCluster.PRIMARIES)
    return redis_cluster.url
