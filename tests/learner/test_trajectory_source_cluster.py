"""The learner's source on a real 3-master Redis Cluster, where the trajectory, feedback and
dead-letter streams live in different slots: each stream is read by its own XREADGROUP (one
read over both met CROSSSLOT before), a dead letter is copied then acknowledged, and what was
read is persisted once, then acknowledged, across a restart."""

from __future__ import annotations

from itertools import islice

import pytest
from redis.cluster import RedisCluster

from agents.events import (
    LEARNER_GROUP,
    STREAM_DEAD,
    STREAM_FEEDBACK,
    STREAM_TRAJECTORIES,
    StreamShards,
)
from learner.store import Store
from learner.trajectory_source import TrajectorySource
from tests.learner.learner_events import feedback, trajectory, xadd
from tests.shard_ids import spread_ids


@pytest.fixture
def cluster(cluster_url):
    client = RedisCluster.from_url(cluster_url)
    yield client
    client.close()


@pytest.fixture
def store(tmp_path):
    s = Store(tmp_path / "store.db")
    yield s
    s.close()


def _source(client, store, consumer="learner-1", **kw) -> TrajectorySource:
    source = TrajectorySource(client, store, consumer, block_ms=10, **kw)
    source.ensure_groups()
    return source


def _drain(source: TrajectorySource) -> list:
    results = [source.poll()]
    while not results[-1].caught_up:
        results.append(source.poll())
    return results


def test_the_streams_are_in_different_slots(cluster):
    slots = {cluster.keyslot(s) for s in (STREAM_TRAJECTORIES, STREAM_FEEDBACK, STREAM_DEAD)}
    assert len(slots) == 3  # what makes one read over both streams CROSSSLOT


def test_runs_and_feedback_are_persisted_once_then_acknowledged(cluster, store):
    source = _source(cluster, store)
    runs = [trajectory(with_ids=False) for _ in range(3)]
    for t in runs:
        xadd(cluster, t)
        xadd(cluster, feedback(t.event_id))
    xadd(cluster, runs[0])  # the agent API retried an event
    results = _drain(source)
    assert sum(r.new for r in results) == 6 and sum(r.duplicates for r in results) == 1
    assert store.counts() == {"trajectories/open": 3, "feedback/open": 3}
    assert source.pending() == 0
    assert source.trim() == {STREAM_TRAJECTORIES: 4, STREAM_FEEDBACK: 3}


def test_a_restarted_learner_reads_its_pending_entries_once(cluster, store):
    _source(cluster, store)
    t = trajectory(with_ids=False)
    xadd(cluster, t)
    xadd(cluster, feedback(t.event_id))
    for stream in (STREAM_TRAJECTORIES, STREAM_FEEDBACK):  # read, then died before persisting
        cluster.xreadgroup(LEARNER_GROUP, "learner-1", {stream: ">"})
    source = _source(cluster, store, claim_idle_ms=3_600_000)
    assert sum(r.new for r in _drain(source)) == 2 and source.pending() == 0
    again = _source(cluster, store)
    assert sum(r.read for r in _drain(again)) == 0  # nothing counted twice


def test_a_bad_entry_goes_to_the_dead_letter_stream(cluster, store):
    source = _source(cluster, store)
    cluster.xadd(STREAM_FEEDBACK, {"foo": "bar"})
    xadd(cluster, trajectory(with_ids=False))
    dead = [d for r in _drain(source) for d in r.dead]
    assert len(dead) == 1 and "unknown event type" in dead[0].reason
    [(_, fields)] = cluster.xrange(STREAM_DEAD)
    assert fields[b"dead_stream"] == STREAM_FEEDBACK.encode() and source.pending() == 0
    assert store.counts() == {"trajectories/open": 1}


def test_every_shard_is_read_once_and_a_dead_letter_stays_in_its_shard(cluster, store):
    shards = StreamShards(3)
    source = _source(cluster, store, shards=shards)
    runs = [trajectory(with_ids=False, event_id=i) for i in islice(spread_ids(shards), 9)]
    for t in runs:
        xadd(cluster, t, shards)
        xadd(cluster, feedback(t.event_id), shards)
    assert all(cluster.exists(s) for s in shards.all_trajectories())  # the runs spread
    bad = shards.feedback(2)
    cluster.xadd(bad, {"foo": "bar"})
    results = _drain(source)
    assert sum(r.new for r in results) == 18 and source.pending() == 0
    assert store.counts() == {"trajectories/open": 9, "feedback/open": 9}
    [dead] = [d for r in results for d in r.dead]
    assert dead.stream == bad and cluster.xlen(shards.dead(2)) == 1
    assert not any(cluster.exists(s) for s in (shards.dead(0), shards.dead(1), STREAM_DEAD))
    trimmed = source.trim()
    assert sum(trimmed.values()) == 19 and set(trimmed) <= set(source.streams)
    again = _source(cluster, store, "learner-2", shards=shards)
    assert sum(r.read for r in _drain(again)) == 0  # nothing delivered twice
