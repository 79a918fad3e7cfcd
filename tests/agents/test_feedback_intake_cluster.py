"""The feedback intake on a real 3-master Redis Cluster: its one script's keys (rate windows,
replay marker, named-score count, the stream) share the stream's slot, so it accepts, refuses a
replay, counts the rate and caps named scores there as on one Redis. Before the hash tags the
script met CROSSSLOT. And on a plain Redis, a replay marker written before them still counts."""

from __future__ import annotations

import pytest
from redis.asyncio.cluster import RedisCluster as AsyncCluster
from redis.cluster import RedisCluster

from agents.events import LEGACY_SEEN_PREFIX, STREAM_FEEDBACK
from agents.feedback_intake import FeedbackIntake, FeedbackRejected, FeedbackSubmission
from agents.feedback_tokens import issue
from tests.fakes.fixtures import aredis  # noqa: F401

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
    intake = FeedbackIntake(acluster, SECRET, rate_per_minute=3)
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
