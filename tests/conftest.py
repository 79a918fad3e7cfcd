"""Shared fixtures: a real Redis server per test session, a clean database per test; torch
fixed to one thread and deterministic kernels for the whole session."""

from __future__ import annotations

import os

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
os.environ.setdefault("TLDEXTRACT_PUBLIC_SUFFIX_LIST_URLS", "")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # see deploy/__init__.py
os.environ.setdefault("GOMP_SPINCOUNT", "30000")

import pytest
import redis
import torch

from deploy.embedded_redis import RedisProcess, start_redis
from tests.model_cache import model_cache  # noqa: F401 - autouse: a private model cache
from tests.redis_cluster import cluster_url, redis_cluster  # noqa: F401 - a real Redis Cluster

# Tests that train or generate give the same floats every run: one intra-op thread (its sums
# do not depend on how the machine's cores are shared) and deterministic kernels.
torch.set_num_threads(1)
torch.use_deterministic_algorithms(True)


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory) -> RedisProcess:
    """A real redis-server on a free port, in a temp dir, for the whole session."""
    server = start_redis(tmp_path_factory.mktemp("redis"))
    yield server
    server.stop()


@pytest.fixture
def redis_url(redis_server: RedisProcess) -> str:
    """The session server's URL, with its database flushed before the test."""
    with redis.Redis.from_url(redis_server.url) as r:
        r.flushall()
    return redis_server.url


@pytest.fixture
def redis_client(redis_url: str) -> redis.Redis:
    client = redis.Redis.from_url(redis_url)
    yield client
    client.close()
