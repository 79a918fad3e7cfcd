"""`arloop learn --once` on a real 3-master Redis Cluster (it ended in CROSSSLOT before): the
learner takes its lease, reads both streams, trains a round on the tiny model, publishes the
version as champion through the registry's one-slot script, and acknowledges what it read;
a second learner on the same store then reads nothing again."""

from __future__ import annotations

import io

from redis.cluster import RedisCluster
from rich.console import Console

from agents.events import LEARNER_GROUP, STREAM_FEEDBACK, STREAM_TRAJECTORIES
from deploy.learn.loop import Learner
from deploy.learn.settings import LearnerSettings
from learner.policy.registry import CHAMPION, PolicyRegistry
from tests.learner.learner_events import feedback, trajectory, xadd


def _learner(cluster_url, tmp_path) -> Learner:
    settings = LearnerSettings(
        redis_url=cluster_url,
        redis_cluster=True,
        data_dir=tmp_path,
        base_model="tiny",
        train={"learning_rate": 0.05},
        min_episodes=3,
        round_interval_s=3600.0,
        read_block_ms=10,
        eval_gate=False,
    )
    return Learner(settings, Console(file=io.StringIO(), width=200))


def test_learn_once_on_a_cluster(cluster_url, tmp_path):
    with RedisCluster.from_url(cluster_url) as client:
        for i in range(4):
            t = trajectory(
                answer="The answer is 42." if i % 2 else "no", logprobs=True, user=f"u{i}"
            )
            xadd(client, t)
            xadd(client, feedback(t.event_id, "thumbs", 1 if i % 2 else -1, user=f"u{i}"))
        learner = _learner(cluster_url, tmp_path)
        assert learner.run(once=True) == 0
        learner.store.close()
        assert PolicyRegistry(client).aliases()[CHAMPION] == "v1"
        for stream in (STREAM_TRAJECTORIES, STREAM_FEEDBACK):
            assert client.xpending(stream, LEARNER_GROUP)["pending"] == 0
        again = _learner(cluster_url, tmp_path)
        again.start()
        assert again.poll() and again.store.counts().get("trajectories/open", 0) == 0
        again.store.close()
