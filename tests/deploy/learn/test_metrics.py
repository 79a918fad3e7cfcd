"""The learner's /metrics and /healthz, and the status it keeps in Redis for the dashboard."""

import io
import json
import logging

import httpx
import pytest
from rich.console import Console

from agents.events import (
    LEARNER_GROUP,
    LEARNER_STATUS,
    STREAM_DEAD,
    STREAM_FEEDBACK,
    STREAM_TRAJECTORIES,
    StreamShards,
)
from deploy.embedded_redis import free_port
from deploy.learn.loop import Learner
from deploy.learn.metrics import LearnerTelemetry, serve_metrics
from deploy.learn.settings import LearnerSettings
from tests.learner.learner_events import feedback, trajectory, xadd


def test_a_round_and_the_streams_show_on_metrics_and_in_the_status(
    redis_url, redis_client, tmp_path
):
    settings = LearnerSettings(
        redis_url=redis_url,
        data_dir=tmp_path,
        base_model="tiny",
        min_episodes=3,
        read_block_ms=10,
        read_count=2,
        train={"learning_rate": 0.05},
    )
    learner = Learner(settings, Console(file=io.StringIO(), width=200))
    learner.start()
    server = serve_metrics(learner.telemetry, "127.0.0.1", free_port())
    url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        for i in range(4):
            t = trajectory(
                answer="The answer is 42." if i % 2 else "no", logprobs=True, user=f"u{i}"
            )
            xadd(redis_client, t)
            xadd(redis_client, feedback(t.event_id, "thumbs", 1 if i % 2 else -1, user=f"u{i}"))
        redis_client.xadd(STREAM_DEAD, {"reason": "poison"})
        learner.telemetry.refresh(force=True)  # nothing read yet: every entry is lag
        status = json.loads(redis_client.get(LEARNER_STATUS))
        lag = {s["stream"]: (s["lag"], s["pending"], s["length"]) for s in status["streams"]}
        assert lag == {STREAM_TRAJECTORIES: (4, 0, 4), STREAM_FEEDBACK: (4, 0, 4)}
        assert status["dead_letters"] == 1 and status["last_round"] is None
        text = httpx.get(f"{url}/metrics").text
        assert f'arloop_learner_stream_lag{{stream="{STREAM_TRAJECTORIES}"}} 4.0' in text
        assert "arloop_learner_dead_letters 1.0" in text
        assert learner.run(once=True) == 0
        status = json.loads(redis_client.get(LEARNER_STATUS))
        assert {s["stream"]: s["lag"] for s in status["streams"]} == {
            STREAM_TRAJECTORIES: 0,
            STREAM_FEEDBACK: 0,
        }
        last = status["last_round"]
        assert (
            last["version"] == "v1" and last["metrics"]["reward"] == learner.last.metrics["reward"]
        )
        assert set(last["metrics"]) >= {"reward", "kl", "entropy", "completions/mean_length"}
        text = httpx.get(f"{url}/metrics").text
        assert 'arloop_learner_rounds_total{outcome="published"} 1.0' in text
        assert f"arloop_learner_kl {learner.last.metrics['kl']}" in text
        assert "arloop_learner_completions_mean_length" in text
        peak = learner.last.metrics["memory/peak_rss_mb"]
        assert peak > 0 and f"arloop_learner_peak_rss_mb {peak}" in text
        health = {"status": "ok", "last_error": None, "champion_problem": None}
        assert httpx.get(f"{url}/healthz").json() == health
        assert httpx.get(f"{url}/nothing").status_code == 404
    finally:
        server.shutdown()
        learner.store.close()


def test_entries_retention_dropped_unread_are_a_gauge_and_one_warning(redis_client, caplog):
    """Issue 36, item 6: the learner says so once per gap, not at every status refresh."""
    if int(redis_client.info("server")["redis_version"].split(".")[0]) < 7:
        pytest.skip("Redis 6.2 keeps no entries-added / entries-read counters")
    redis_client.xgroup_create(STREAM_FEEDBACK, LEARNER_GROUP, id="0", mkstream=True)
    redis_client.xadd(STREAM_FEEDBACK, {"n": 0})
    redis_client.xreadgroup(LEARNER_GROUP, "learner", {STREAM_FEEDBACK: ">"}, count=1)
    for n in range(10):
        redis_client.xadd(STREAM_FEEDBACK, {"n": n}, maxlen=4, approximate=False)
    telemetry = LearnerTelemetry(redis_client, "learner", interval_s=60)
    with caplog.at_level(logging.WARNING, logger="arloop.learner"):
        telemetry.refresh(force=True)
        telemetry.refresh(force=True)
    warned = [r for r in caplog.records if "dropped by retention" in r.getMessage()]
    assert len(warned) == 1 and "6 entries" in warned[0].getMessage()  # 11 added, 1 read, 4 kept
    rendered = telemetry.metrics.render().decode()
    assert f'arloop_learner_trimmed_unread{{stream="{STREAM_FEEDBACK}"}} 6.0' in rendered


def test_the_status_and_gauges_take_in_every_shard(redis_client):
    shards = StreamShards(3)
    for k in range(3):
        redis_client.xadd(shards.trajectories(k), {"n": k})
        redis_client.xadd(shards.dead(k), {"reason": "poison"})
    telemetry = LearnerTelemetry(redis_client, "learner", interval_s=60, shards=shards)
    telemetry.refresh(force=True)
    status = json.loads(redis_client.get(LEARNER_STATUS))
    lag = {s["stream"]: s["lag"] for s in status["streams"]}
    assert lag == {
        **dict.fromkeys(shards.all_trajectories(), 1),
        **dict.fromkeys(shards.all_feedback(), 0),
    }
    assert status["dead_letters"] == 3
    rendered = telemetry.metrics.render().decode()
    assert f'arloop_learner_stream_lag{{stream="{shards.trajectories(2)}"}} 1.0' in rendered
    assert "arloop_learner_dead_letters 3.0" in rendered
