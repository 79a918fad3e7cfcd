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

from agents.events import StreamShards
from deploy.learn.loop import Learner
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


def _learn_once(cluster_url, data_dir, crash_at, shards: int):
    env = _env(
        cluster_url,
        data_dir,
        ARLOOP_CRASH_AT=crash_at,
        ARLOOP_REDIS_CLUSTER="true",
        ARLOOP_STREAM_SHARDS=str(shards),
    )
    return subprocess.run(
        [sys.executable, "-m", "deploy.learn.runner", "--once"],
        cwd=ROOT,
        timeout=240,
        env=env,
        capture_output=True,
        text=True,
    )


@pytest.mark.parametrize(
    ("point", "count"),
    [("after_read", 1), ("after_persist", 1), ("after_commit", 1)]
    + [("after_read", 3), ("after_persist", 3), ("after_commit", 3)],
)
def test_kill_9_then_restart_trains_every_event_exactly_once_on_a_cluster(
    point, count, cluster, cluster_url, tmp_path
):
    """With 3 shards as with one: the runs and their feedback spread over the shards' streams,
    and each shard's events are counted once."""
    shards = StreamShards(count)
    ids = _seed(cluster, n=6 if count > 1 else 4, shards=shards)
    if count > 1:  # the runs did spread: more than one shard holds some
        assert sum(cluster.exists(s) for s in shards.all_trajectories()) > 1
    crashed = _learn_once(cluster_url, tmp_path, point, count)
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr[-2000:]
    persisted, pending, committed, _ = CRASH_STATE[point]
    assert _stored(tmp_path, ids) == (set(ids) if persisted else set())
    assert _pending(cluster, shards) == (len(ids) if pending else 0)

    out = io.StringIO()
    s = _settings(cluster_url, tmp_path).model_copy(
        update={"redis_cluster": True, "stream_shards": count}
    )
    learner = Learner(s, Console(file=out, width=200))
    assert learner.run(once=True) == 0, out.getvalue()
    ledger = learner.store.ledger()
    assert set(ledger) == set(ids)
    trained = [i for m in _manifests(tmp_path).values() for i in m]
    assert sorted(trained) == sorted(ids)  # exactly once, across every checkpoint kept
    assert set(ledger.values()) == {PolicyRegistry(cluster).resolve(CHAMPION)}
    assert _pending(cluster, shards) == 0
    learner.store.close()
