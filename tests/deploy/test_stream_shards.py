"""ARLOOP_STREAM_SHARDS: one shard keeps the stream names from before sharding; N shards are
spread over the cluster's slot space, a run's shard fixed by its id; and a process whose count
differs from the one recorded in Redis is refused at its start, with the fix."""

from __future__ import annotations

import pytest
from redis.crc import key_slot
from typer.testing import CliRunner

from agents.events import (
    CLUSTER_SLOTS,
    STREAM_DEAD,
    STREAM_FEEDBACK,
    STREAM_SHARDS_KEY,
    STREAM_TRAJECTORIES,
    StreamShards,
    check_shards,
)
from agents.feedback_intake import FeedbackIntake
from agents.trajectory_sink import TrajectorySink
from deploy.cli import app
from deploy.settings import AgentApiSettings

runner = CliRunner()


def test_one_shard_is_the_streams_from_before_sharding():
    one = StreamShards(1)
    assert one.all_trajectories() == (STREAM_TRAJECTORIES,)
    assert one.all_feedback() == (STREAM_FEEDBACK,) and one.all_dead() == (STREAM_DEAD,)
    assert one.feedback_tag(0) == "{arloop:feedback}" and one.of("traj_x") == 0


@pytest.mark.parametrize("count", [2, 3, 4, 7])
def test_each_shard_lies_in_its_own_part_of_the_slot_space(count):
    """So on a cluster whose masters hold equal slot ranges, shards land on different masters."""
    shards = StreamShards(count)
    for k in range(count):
        low, high = k * CLUSTER_SLOTS // count, (k + 1) * CLUSTER_SLOTS // count
        for name in (shards.trajectories(k), shards.feedback(k), shards.dead(k)):
            assert low <= key_slot(name.encode()) < high, name
            assert shards.shard_of_stream(name) == k


def test_a_runs_shard_is_fixed_by_its_id_and_the_shards_share_the_runs():
    shards = StreamShards(3)
    runs = [f"traj_{i:032x}" for i in range(3000)]
    assert [shards.of(r) for r in runs] == [StreamShards(3).of(r) for r in runs]
    counts = [sum(shards.of(r) == k for r in runs) for k in range(3)]
    assert min(counts) > 900  # 1000 each, give or take the hash


def test_a_shard_count_out_of_range_is_one_settings_line(tmp_path):
    result = runner.invoke(
        app, ["policy", "list"], env={"ARLOOP_DATA_DIR": str(tmp_path), "ARLOOP_STREAM_SHARDS": "0"}
    )
    out = " ".join(result.output.split())
    assert result.exit_code == 2 and "Traceback" not in out, out
    assert "ARLOOP_STREAM_SHARDS" in out, out


def test_the_learner_refuses_streams_sharded_another_way(redis_url, redis_client, tmp_path):
    redis_client.set(STREAM_SHARDS_KEY, 3)
    env = {"ARLOOP_DATA_DIR": str(tmp_path), "ARLOOP_REDIS_URL": redis_url}
    result = runner.invoke(app, ["learn", "--once"], env=env)
    out = " ".join(result.output.split())
    assert result.exit_code == 2 and "Traceback" not in out, out
    assert "ARLOOP_STREAM_SHARDS=1, but this Redis's streams are split into '3'" in out, out
    assert f"DEL {STREAM_SHARDS_KEY}" in out and "docs/deploying.md" in out, out
    assert redis_client.get(STREAM_SHARDS_KEY) == b"3"  # left as it was


def test_the_first_process_records_its_count(start_api, redis_client):
    api = start_api(stream_shards=2)
    assert api.http.get("/healthz").status_code == 200
    assert redis_client.get(STREAM_SHARDS_KEY) == b"2"
    assert AgentApiSettings(_env_file=None, stream_shards=2).shards == StreamShards(2)


def test_each_shard_keeps_its_share_of_the_streams_retention(redis_client):
    """ARLOOP_STREAM_MAX_ENTRIES bounds the streams together, whatever the shard count."""
    shards = StreamShards(3)
    assert TrajectorySink(redis_client, max_entries=3000, shards=shards).max_entries == 1000
    assert (
        FeedbackIntake(redis_client, "s" * 40, 60, max_entries=3000, shards=shards).max_entries
        == 1000
    )
    eval_sink = TrajectorySink(
        redis_client, stream="arloop:eval:x", max_entries=3000, shards=shards
    )
    assert eval_sink.max_entries == 3000 and eval_sink.stream_of("traj_1") == "arloop:eval:x"


def test_a_recorded_count_that_is_no_number_is_a_mismatch_not_a_crash():
    assert (
        check_shards(None, StreamShards(2)) is None and check_shards(b"2", StreamShards(2)) is None
    )
    why = check_shards(b"three" * 100, StreamShards(2))
    assert why.startswith("ARLOOP_STREAM_SHARDS=2, but") and len(why) < 600
