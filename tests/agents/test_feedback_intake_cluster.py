"""The feedback intake on a real 3-master Redis Cluster: its one script's keys (rate windows,
replay marker, named-score count, the stream) share the stream's slot, so it accepts, refuses a
replay, counts the rate and caps named scores there as on one Redis. Before the hash tags the
script met CROSSSLOT. And on a plain Redis, a replay marker written before them still counts."""

from __future__ import annotations

import dataclasses

import pytest
from redis.asyncio.cluster import RedisCluster as AsyncCluster
from redis.cluster import RedisCluster

from agents.events import LEGACY_SEEN_PREFIX, STREAM_FEEDBACK, StreamShards, decode
from agents.feedback_intake import FeedbackIntake, FeedbackRejected, FeedbackSubmission
from agents.feedback_tokens import issue
from tests.fakes.fixtures import aredis, held_minute  # noqa: F401

SECRET = "s" * 40


@pytest.fixture
async def acluster(cluster_url):
    client = AsyncCluster.from_url(cluster_url, socket_timeout=30)
    yield client
    await client.aclose()


def rating(token: str, trajectory: str) -> FeedbackSubmission:
    return FeedbackSubmission(trajectory, token, "rating", 5.0, user_id="u1")


async def test_feedback_lands_once_per_run_and_kind_on_a_cluster(acluster, cluster_url):
    intake = FeedbackIntake(acluster, SECRET, rate_per_minute=1000, scores_per_run=2)
    runs = [f"traj_{i:032x}" for i in range(12)]  # ids that hash all over the cluster
    for run in runs:
        token = issue(SECRET, run, "u1", "v0", 3600)
        assert await intake.accept(rating(token, run))
        with pytest.raises(FeedbackRejected) as replay:
            await intake.accept(rating(token, run))
        assert replay.value.status == 409
    token = issue(SECRET, runs[0], "u1", "v0", 3600)
    for name in ("clarity", "tone"):
        await intake.accept(
            FeedbackSubmission(runs[0], token, "score", 0.5, user_id="u1", key=name)
        )
    with pytest.raises(FeedbackRejected, match="2 named scores"):
        await intake.accept(FeedbackSubmission(runs[0], token, "score", 0.5, user_id="u1", key="x"))
    with RedisCluster.from_url(cluster_url) as sync:
        assert sync.xlen(STREAM_FEEDBACK) == 12 + 2


async def test_the_rate_window_counts_on_a_cluster(acluster):
    intake = FeedbackIntake(acluster, SECRET, rate_per_minute=3, clock=held_minute())
    for i in range(3):
        run = f"traj_{i:032x}"
        await intake.accept(rating(issue(SECRET, run, "u1", "v0", 3600), run))
    run = f"traj_{9:032x}"
    with pytest.raises(FeedbackRejected) as limited:
        await intake.accept(rating(issue(SECRET, run, "u1", "v0", 3600), run))
    assert limited.value.status == 429


async def test_a_marker_from_before_the_hash_tags_still_refuses_a_replay(aredis, redis_client):  # noqa: F811
    redis_client.set(f"{LEGACY_SEEN_PREFIX}:traj_1:rating", "fb_old|nonce", ex=600)
    intake = FeedbackIntake(aredis, SECRET, rate_per_minute=60)
    with pytest.raises(FeedbackRejected) as replay:
        await intake.accept(rating(issue(SECRET, "traj_1", "u1", "v0", 3600), "traj_1"))
    assert replay.value.status == 409 and redis_client.xlen(STREAM_FEEDBACK) == 0


async def test_sharded_feedback_goes_to_its_runs_shard_once_on_a_cluster(acluster, cluster_url):
    shards = StreamShards(3)
    intake = FeedbackIntake(acluster, SECRET, rate_per_minute=1000, shards=shards)
    runs = [f"traj_{i:032x}" for i in range(12)]
    for run in runs:
        token = issue(SECRET, run, "u1", "v0", 3600)
        await intake.accept(rating(token, run))
        with pytest.raises(FeedbackRejected) as replay:  # its marker is in its shard's slot
            await intake.accept(rating(token, run))
        assert replay.value.status == 409
    with RedisCluster.from_url(cluster_url) as sync:
        on = {
            k: {decode(fields).trajectory_id for _, fields in sync.xrange(shards.feedback(k))}
            for k in range(3)
        }
        assert not sync.exists(STREAM_FEEDBACK)  # nothing on the unsharded stream
    assert all(on.values()) and sum(map(len, on.values())) == 12  # every shard took some
    assert all(shards.of(run) == k for k, runs_on in on.items() for run in runs_on)


async def test_a_users_rate_window_spans_every_shard(acluster, cluster_url):
    """A user's feedback on runs of different shards counts in one window: the limit is the
    user's, not one per shard."""
    shards = StreamShards(3)
    intake = FeedbackIntake(acluster, SECRET, rate_per_minute=3, shards=shards, clock=held_minute())
    runs = [f"traj_{i:032x}" for i in range(8)]
    assert len({shards.of(r) for r in runs[:4]}) > 1  # the runs are on several shards
    for run in runs[:3]:
        await intake.accept(rating(issue(SECRET, run, "u1", "v0", 3600), run))
    with pytest.raises(FeedbackRejected) as limited:
        await intake.accept(rating(issue(SECRET, runs[3], "u1", "v0", 3600), runs[3]))
    assert limited.value.status == 429 and "3 per minute" in limited.value.reason
    other = FeedbackSubmission(runs[4], issue(SECRET, runs[4], "u2", "v0", 3600), "rating", 4.0)
    assert await intake.accept(dataclasses.replace(other, user_id="u2"))  # another user's own
    with RedisCluster.from_url(cluster_url) as sync:
        windows = list(sync.scan_iter("arloop:rate:{u:u1}:*", target_nodes=RedisCluster.PRIMARIES))
        assert windows and all(0 < sync.ttl(w) <= 120 for w in windows)  # each expires
