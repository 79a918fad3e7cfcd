"""Issue 36, item 6: what retention does to runs the learner has not read yet. The streams keep
about ARLOOP_STREAM_MAX_ENTRIES; past it the oldest go whether read or not, and those the
learner never read are counted (Redis 7's stream counters) until it reads on."""

from __future__ import annotations

import pytest

from agents.events import LEARNER_GROUP, STREAM_FEEDBACK, StreamShards
from deploy.stream_stats import all_stats, stream_stats


def redis_major(client) -> int:
    return int(client.info("server")["redis_version"].split(".")[0])


def test_entries_dropped_before_the_learner_read_them_are_counted(redis_client):
    if redis_major(redis_client) < 7:
        pytest.skip("Redis 6.2 keeps no entries-added / entries-read counters")
    redis_client.xgroup_create(STREAM_FEEDBACK, LEARNER_GROUP, id="0", mkstream=True)
    for n in range(10):
        redis_client.xadd(STREAM_FEEDBACK, {"n": n})
    assert stream_stats(redis_client, STREAM_FEEDBACK).trimmed_unread == 0
    redis_client.xreadgroup(LEARNER_GROUP, "learner", {STREAM_FEEDBACK: ">"}, count=3)
    for n in range(10):  # the learner stops; retention keeps 5 (exact, for the count)
        redis_client.xadd(STREAM_FEEDBACK, {"n": n}, maxlen=5, approximate=False)
    stats = stream_stats(redis_client, STREAM_FEEDBACK)
    assert (stats.length, stats.trimmed_unread) == (5, 12)  # 20 added, 3 read, 5 left
    redis_client.xreadgroup(LEARNER_GROUP, "learner", {STREAM_FEEDBACK: ">"}, count=100)
    assert stream_stats(redis_client, STREAM_FEEDBACK).trimmed_unread == 0  # read on: no gap


def test_trimming_only_what_the_learner_read_counts_nothing(redis_client):
    redis_client.xgroup_create(STREAM_FEEDBACK, LEARNER_GROUP, id="0", mkstream=True)
    for n in range(10):
        redis_client.xadd(STREAM_FEEDBACK, {"n": n})
    redis_client.xreadgroup(LEARNER_GROUP, "learner", {STREAM_FEEDBACK: ">"}, count=8)
    redis_client.xtrim(STREAM_FEEDBACK, maxlen=4, approximate=False)
    expected = 0 if redis_major(redis_client) >= 7 else None
    assert stream_stats(redis_client, STREAM_FEEDBACK).trimmed_unread == expected


def test_every_shards_streams_and_dead_letters_are_counted(redis_client):
    shards = StreamShards(3)
    for k in range(3):
        for n in range(k + 1):
            redis_client.xadd(shards.trajectories(k), {"n": n})
        redis_client.xadd(shards.dead(k), {"reason": "poison"})
    redis_client.xadd(shards.feedback(2), {"n": 0})
    stats = all_stats(redis_client, shards)
    lengths = {s["stream"]: s["length"] for s in stats["streams"]}
    assert lengths == {
        **dict(zip(shards.all_trajectories(), (1, 2, 3), strict=True)),
        **dict(zip(shards.all_feedback(), (0, 0, 1), strict=True)),
    }
    assert stats["dead_letters"] == 3
