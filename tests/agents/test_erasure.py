"""An erasure on streams split into three shards, on a real 3-master Redis Cluster: the user's
runs, feedback and dead letters go from every shard, with others' feedback on the user's runs
(a reviewer's); everyone else's stays. Before, it read the unsharded stream names: nothing."""

from __future__ import annotations

import pytest
from redis.asyncio.cluster import RedisCluster as AsyncCluster

from agents.erasure import forget_user
from agents.events import (
    FORGET_REQUESTS,
    FeedbackEvent,
    FeedbackKind,
    StreamShards,
    TrajectoryEvent,
    decode,
    encode,
    new_id,
)
from agents.feedback_intake import FeedbackIntake, FeedbackSubmission
from agents.feedback_tokens import issue
from agents.trajectory_sink import TrajectorySink
from tests.shard_ids import spread_ids

SECRET = "s" * 40
SHARDS = StreamShards(3)


@pytest.fixture
async def acluster(cluster_url):
    client = AsyncCluster.from_url(cluster_url, socket_timeout=30)
    yield client
    await client.aclose()


def run_of(user: str, event_id: str) -> TrajectoryEvent:
    return TrajectoryEvent(
        event_id=event_id,
        thread_id="th",
        agent="tutor",
        user_id=user,
        input="2+3?",
        output="5",
        policy_version="v0",
        steps=[],
        started_at=0.0,
        finished_at=1.0,
    )


async def test_a_users_events_go_from_every_shard_on_a_cluster(acluster):
    sink = TrajectorySink(acluster, shards=SHARDS)
    intake = FeedbackIntake(acluster, SECRET, rate_per_minute=1000, shards=SHARDS)
    ids = spread_ids(SHARDS)  # the shards in turn: u_gone's runs on 0, 2, 1, 0, 2, 1
    runs = [run_of(user, next(ids)) for _ in range(6) for user in ("u_gone", "u_kept")]
    for run in runs:
        await sink.write(run)
        token = issue(SECRET, run.trajectory_id, run.user_id, "v0", 3600)
        sub = FeedbackSubmission(run.trajectory_id, token, "thumbs", 1, user_id=run.user_id)
        await intake.accept(sub)
    gone = [r for r in runs if r.user_id == "u_gone"]
    assert len({SHARDS.of(r.trajectory_id) for r in gone}) > 1  # the user's runs spread
    review = FeedbackEvent(
        event_id=new_id("fb"),
        trajectory_id=gone[0].trajectory_id,
        user_id="u_reviewer",
        kind=FeedbackKind.REVIEW,
        value=1,
        source="review",
        policy_version="v0",
    )
    shard = SHARDS.of(gone[0].trajectory_id)
    await acluster.xadd(SHARDS.feedback(shard), encode(review))
    await acluster.xadd(SHARDS.dead(shard), {"data": '{"user_id":"u_gone"}', "reason": "poison"})
    erased = await forget_user(acluster, "u_gone", SHARDS)
    assert erased.events == 6 + 6 + 1 + 1
    left = []
    for stream in (*SHARDS.all_trajectories(), *SHARDS.all_feedback()):
        left += [decode(f) for _, f in await acluster.xrange(stream)]
    assert {e.user_id for e in left} == {"u_kept"} and len(left) == 12
    assert [await acluster.xlen(s) for s in SHARDS.all_dead()] == [0, 0, 0]
    assert await acluster.hexists(FORGET_REQUESTS, "u_gone")
