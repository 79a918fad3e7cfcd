"""The demo report's traffic figures come from every shard's runs and feedback (the shard count
its processes recorded in Redis). Before, it read the unsharded stream names: no traffic."""

from __future__ import annotations

from agents.events import STREAM_SHARDS_KEY, StreamShards
from agents.packs.base import Pack
from deploy.demo.report import build_report
from learner.policy.registry import PolicyRegistry
from tests.learner.learner_events import feedback, trajectory, xadd
from tests.shard_ids import spread_ids


def test_the_report_counts_every_shards_runs_and_thumbs(redis_client):
    shards = StreamShards(3)
    redis_client.set(STREAM_SHARDS_KEY, 3)
    PolicyRegistry(redis_client).ensure_base("tiny")
    for i, run in zip(range(9), spread_ids(shards), strict=False):  # 3 runs on each shard
        t = trajectory(user=f"u{i}", event_id=run)
        xadd(redis_client, t, shards)
        xadd(redis_client, feedback(t.event_id, "thumbs", 1 if i % 3 else -1), shards)
    report = build_report(redis_client, Pack(name="none"))
    v0 = report.row("v0")
    assert (v0.traffic_runs, v0.thumbs_up, v0.thumbs_down) == (9, 6, 3)
    assert report.feedback_counts == {"thumbs": 9}
