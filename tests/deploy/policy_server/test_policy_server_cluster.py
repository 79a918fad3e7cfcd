"""The policy server on a real 3-master Redis Cluster (ARLOOP_REDIS_CLUSTER): it reads the
registry through the cluster client and swaps to a newly promoted version on the registry's
pub/sub notice (the periodic check is set far beyond the wait, so the notice is what moves it)."""

from __future__ import annotations

import time

import httpx
from redis.cluster import RedisCluster

from learner.policy.registry import PolicyRegistry
from tests.deploy.policy_server.support import make_lora, publish, running_server, tiny_settings

HI = [{"role": "user", "content": "Hi"}]


def _fingerprint(base: str) -> str:
    body = {"model": "arloop", "messages": HI, "max_tokens": 4}
    return httpx.post(f"{base}/chat/completions", json=body, timeout=60).json()[
        "system_fingerprint"
    ]


def test_a_promoted_version_is_served_on_its_notice(cluster_url, tmp_path):
    with RedisCluster.from_url(cluster_url) as client:
        registry = PolicyRegistry(client)
        registry.ensure_base("tiny")
        settings = tiny_settings(cluster_url, redis_cluster=True, reload_poll_s=600.0)
        with running_server(settings) as base:
            assert _fingerprint(base) == "v0"
            name = publish(registry, "lora", make_lora(tmp_path / "x", seed=5))
            deadline = time.monotonic() + 30
            while _fingerprint(base) != name:
                assert time.monotonic() < deadline, "the notice never moved the server"
                time.sleep(0.1)
