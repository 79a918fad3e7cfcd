"""The serving contract over real HTTP on a real 3-master Redis Cluster (ARLOOP_REDIS_CLUSTER):
runs on threads (each thread's record and run lock in one slot), their trajectories, feedback
with its replay refused, rate windows; and `/healthz` not ready once the cluster is down. Before
the cluster client, 0 of 12 runs succeeded (MOVED on the rate window's pipeline)."""

from __future__ import annotations

from redis.cluster import RedisCluster

from agents.events import STREAM_FEEDBACK, STREAM_TRAJECTORIES, decode
from tests.fakes.scripted_llm import Reply


def test_twelve_runs_and_their_feedback_on_a_cluster(start_api, llm, cluster_url):
    api = start_api(redis_url=cluster_url, redis_cluster=True)
    assert api.http.get("/healthz").json() == {"status": "ok", "redis": "ok"}
    runs = []
    for i in range(12):
        llm.push(Reply(content=f"{i}"))
        reply = api.run(f"What is {i}+0?", user=f"u{i % 4}", thread_id=f"thread-{i % 4}")
        assert reply.status_code == 200, reply.text
        runs.append(reply.json())
    for i, body in enumerate(runs):
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
