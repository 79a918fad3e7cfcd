"""`arloop serve vllm-sync` on a real 3-master Redis Cluster (ARLOOP_REDIS_CLUSTER): the
registry's versions load into the fake vLLM under their names, the sync's record and the
delivery check read back, the loop follows the registry's notice (pub/sub through the cluster
client), and `--once` / `--check` run as commands."""

from __future__ import annotations

import pytest
from redis.cluster import RedisCluster
from typer.testing import CliRunner

from deploy.vllm_sync.check import delivery_check
from deploy.vllm_sync.record import read_record
from learner.policy.registry import CHAMPION
from tests.deploy.vllm_sync.conftest import DRAIN_S, loads_at_the_notice, world_on


@pytest.fixture
def cworld(cluster_url, tmp_path):
    with RedisCluster.from_url(cluster_url) as client, world_on(client, tmp_path) as world:
        yield world


def test_versions_load_retire_and_check_on_a_cluster(cworld):
    v1 = cworld.publish(seed=1)
    record = cworld.sync.step()
    assert record.status == "ok" and record.routes[CHAMPION] == cworld.adapter(v1)
    assert cworld.adapter(v1) in cworld.fake.loras
    v2 = cworld.publish(seed=2)
    cworld.sync.step()
    cworld.clock.now += DRAIN_S
    record = cworld.sync.step()
    assert record.routes[CHAMPION] == cworld.adapter(v2)
    assert cworld.adapter(v1) not in cworld.fake.loras  # retired after the drain
    stored = read_record(cworld.sync.client, "arloop")
    findings = delivery_check(cworld.registry, stored, cworld.sync.vllm.models())
    assert all(f.ok for f in findings), findings


def test_the_loop_follows_the_registrys_notice_on_a_cluster(cworld, cluster_url):
    from deploy.vllm_sync.settings import VllmSyncSettings

    settings = VllmSyncSettings(
        _env_file=None,
        redis_url=cluster_url,
        redis_cluster=True,
        vllm_url=cworld.server.url,
        vllm_poll_s=60,
    )
    loads_at_the_notice(cworld, settings)


def test_once_and_check_as_commands_on_a_cluster(cworld, cluster_url, monkeypatch):
    from deploy.cli import app

    monkeypatch.setenv("ARLOOP_REDIS_URL", cluster_url)
    monkeypatch.setenv("ARLOOP_REDIS_CLUSTER", "true")
    monkeypatch.setenv("ARLOOP_VLLM_URL", cworld.server.url)
    v1 = cworld.publish(seed=1)
    runner = CliRunner()
    once = runner.invoke(app, ["serve", "vllm-sync", "--once"])
    assert once.exit_code == 0, once.output
    ok = runner.invoke(app, ["serve", "vllm-sync", "--check"])
    assert ok.exit_code == 0 and f"as {cworld.adapter(v1)}" in ok.output, ok.output
