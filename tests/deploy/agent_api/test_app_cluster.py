"""The serving contract over real HTTP on a real 3-master Redis Cluster (ARLOOP_REDIS_CLUSTER):
runs on threads (each thread's record and run lock in one slot), their trajectories, feedback
with its replay refused, rate windows; and `/healthz` not ready once the cluster is down. Before
the cluster client, 0 of 12 runs succeeded (MOVED on the rate window's pipeline)."""

from __future__ import annotations

from redis.cluster import RedisCluster

from agents.events import (
    STREAM_FEEDBACK,
    STREAM_SHARDS_KEY,
    STREAM_TRAJECTORIES,
    StreamShards,
    decode,
)
from deploy.agent_api import app as agent_app
from tests.fakes.scripted_llm import Reply
from tests.shard_ids import spread_new_id


def test_twelve_runs_and_their_feedback_on_a_cluster(start_api, llm, cluster_url):
    api = start_api(redis_url=cluster_url, redis_cluster=True)
    assert api.http.get("/healthz").json() == {"status": "ok", "redis": "ok"}
    runs = []
    for i in range(12):
        llm.push(Reply(content=f"{i}"))
        reply = api.run(f"What is {i}+0?", user=f"u{i % 4}", thread_id=f"thread-{i % 4}")
        assert reply.status_code == 200, reply.text
        runs.append(reply.json())
    for body in runs:
        up = api.feedback(
            trajectory_id=body["trajectory_id"],
            feedback_token=body["feedback_token"],
            kind="thumbs",
            value=1,
        )
        assert up.status_code == 202, up.text
    again = api.feedback(
        trajectory_id=runs[0]["trajectory_id"],
        feedback_token=runs[0]["feedback_token"],
        kind="thumbs",
        value=-1,
    )
    assert again.status_code == 409
    with RedisCluster.from_url(cluster_url) as client:
        trajectories = [decode(f) for _, f in client.xrange(STREAM_TRAJECTORIES)]
        feedback = [decode(f) for _, f in client.xrange(STREAM_FEEDBACK)]
    assert [t.trajectory_id for t in trajectories] == [b["trajectory_id"] for b in runs]
    assert [f.trajectory_id for f in feedback] == [b["trajectory_id"] for b in runs]
    thread = api.http.get("/v1/threads/thread-1", params={"user_id": "u1"})
    assert thread.status_code == 200, thread.text


def test_feedback_listing_and_dashboard_read_a_cluster(start_api, llm, cluster_url):
    api = start_api(redis_url=cluster_url, redis_cluster=True)
    runs = []
    for i in range(3):
        llm.push(Reply(content=f"{i}"))
        runs.append(api.run(f"What is {i}+1?").json())
        api.feedback(
            trajectory_id=runs[-1]["trajectory_id"],
            feedback_token=runs[-1]["feedback_token"],
            kind="thumbs",
            value=1,
        )
    page = api.http.get("/v1/feedback", params={"limit": 2}).json()
    assert [i["trajectory_id"] for i in page["items"]] == [r["trajectory_id"] for r in runs[:2]]
    rest = api.http.get("/v1/feedback", params={"cursor": page["next_cursor"]}).json()
    assert [i["trajectory_id"] for i in rest["items"]] == [runs[2]["trajectory_id"]]
    for path in ("/v1/dashboard", "/v1/report-card"):
        assert api.http.get(path).status_code == 200, path


def test_a_teams_run_over_chat_completions_on_a_cluster(start_api, llm, cluster_url):
    """A team's run (`X-Arloop-Run`): its record and steps share the trajectory's slot."""
    from tests.deploy.agent_api.test_chat_completions import ask, end, sdk

    llm.push(Reply(content="It is 5."), Reply(content="Yes, 5."))
    api = start_api(redis_url=cluster_url, redis_cluster=True)
    client = sdk(api, run="job-1")
    headers, _ = ask(client)
    again, _ = ask(client, messages=[{"role": "user", "content": "Sure?"}])
    trajectory_id = headers["X-Arloop-Trajectory"]
    assert again["X-Arloop-Trajectory"] == trajectory_id
    ended = end(api, trajectory_id, "Yes, 5.")
    assert ended.status_code == 200 and ended.json()["steps"] == 2, ended.text
    up = api.feedback(
        trajectory_id=trajectory_id,
        feedback_token=again["X-Arloop-Feedback-Token"],
        kind="thumbs",
        value=1,
    )
    assert up.status_code == 202, up.text
    with RedisCluster.from_url(cluster_url) as c:
        [event] = [decode(f) for _, f in c.xrange(STREAM_TRAJECTORIES)]
    assert event.trajectory_id == trajectory_id and len(event.model_steps) == 2


def test_sharded_streams_put_each_run_and_its_feedback_in_its_shard(
    start_api, llm, cluster_url, monkeypatch
):
    shards = StreamShards(3)
    monkeypatch.setattr(agent_app, "new_id", spread_new_id(shards))  # the runs on each shard
    api = start_api(redis_url=cluster_url, redis_cluster=True, stream_shards=3)
    assert api.http.get("/healthz").status_code == 200
    runs = []
    for i in range(9):
        llm.push(Reply(content=f"{i}"))
        runs.append(api.run(f"What is {i}+2?", user=f"u{i % 3}").json())
        up = api.feedback(
            trajectory_id=runs[-1]["trajectory_id"],
            feedback_token=runs[-1]["feedback_token"],
            kind="thumbs",
            value=1,
        )
        assert up.status_code == 202, up.text
    with RedisCluster.from_url(cluster_url) as client:
        shard_of = {}
        for k in range(3):
            for stream in (shards.trajectories(k), shards.feedback(k)):
                for _, fields in client.xrange(stream):
                    shard_of.setdefault(decode(fields).trajectory_id, set()).add(k)
        assert not client.exists(STREAM_TRAJECTORIES) and not client.exists(STREAM_FEEDBACK)
        assert client.get(STREAM_SHARDS_KEY) == b"3"  # recorded for the next process to check
    assert set(shard_of) == {r["trajectory_id"] for r in runs}
    assert all(ks == {shards.of(run)} for run, ks in shard_of.items())  # run + feedback: one
    assert {shards.of(run) for run in shard_of} == {0, 1, 2}  # and the runs spread


def test_healthz_is_not_ready_on_streams_sharded_another_way(start_api, cluster_url):
    with RedisCluster.from_url(cluster_url) as client:
        client.set(STREAM_SHARDS_KEY, 1)  # a service with one shard started first
    api = start_api(redis_url=cluster_url, redis_cluster=True, stream_shards=3)
    health = api.http.get("/healthz")
    assert health.status_code == 503, health.text
    assert "ARLOOP_STREAM_SHARDS=3, but this Redis's streams are split into '1'" in health.text
