"""kill -9 of a real learner process on a real 3-master Redis Cluster, at the points where
Redis holds the state (read, persisted, committed): after a restart, every event is trained
on exactly once and nothing is left pending, as on one Redis (tests/learner/test_crash_safety)."""

from __future__ import annotations

import io
import signal
import subprocess
import sys

import pytest
from redis.cluster import RedisCluster
from rich.console import Console

from deploy.learn.runner import Learner
from learner.policy.registry import CHAMPION, PolicyRegistry
from tests.learner.test_crash_safety import (
    CRASH_STATE,
    _env,
    _manifests,
    _pending,
    _seed,
    _settings,
    _stored,
)
from tests.learner.test_crash_safety import REPO as ROOT


@pytest.fixture
def cluster(cluster_url):
    client = RedisCluster.from_url(cluster_url)
    yield client
    client.close()


def _learn_once(cluster_url, data_dir, crash_at):
    env = _env(cluster_url, data_dir, ARLOOP_CRASH_AT=crash_at, ARLOOP_REDIS_CLUSTER="true")
    return subprocess.run(
        [sys.executable, "-m", "deploy.learn.runner", "--once"],
        cwd=ROOT,
        timeout=240,
        env=env,
        capture_output=True,
        text=True,
    )


@pytest.mark.parametrize("point", ["after_read", "after_persist", "after_commit"])
def test_kill_9_then_restart_trains_every_event_exactly_once_on_a_cluster(
    point, cluster, cluster_url, tmp_path
):
    ids = _seed(cluster)
    crashed = _learn_once(cluster_url, tmp_path, point)
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr[-2000:]
    persisted, pending, committed, _ = CRASH_STATE[point]
    assert _stored(tmp_path, ids) == (set(ids) if persisted else set())
    assert _pending(cluster) == (len(ids) if pending else 0)

    out = io.StringIO()
    s = _settings(cluster_url, tmp_path).model_copy(update={"redis_cluster": True})
    learner = Learner(s, Console(file=out, width=200))
    assert learner.run(once=True) == 0, out.getvalue()
    ledger = learner.store.ledger()
    assert set(ledger) == set(ids)
    trained = [i for m in _manifests(tmp_path).values() for i in m]
    assert sorted(trained) == sorted(ids)  # exactly once, across every checkpoint kept
    assert set(ledger.values()) == {PolicyRegistry(cluster).resolve(CHAMPION)}
    assert _pending(cluster) == 0
    learner.store.close()
