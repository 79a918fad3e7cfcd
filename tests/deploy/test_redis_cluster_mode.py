"""ARLOOP_REDIS_CLUSTER against what is really there: a cluster-style URL, cluster mode on a
plain Redis, a plain client on a cluster node, each one line naming the fix (no traceback);
`arloop policy list` on a real cluster (a MovedError before); `/healthz` not ready once the
cluster is down."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from deploy.cli import app
from learner.policy.registry import PolicyRegistry
from tests.redis_cluster import start_cluster

runner = CliRunner()


def _list(tmp_path, **env):
    env = {"ARLOOP_DATA_DIR": str(tmp_path), **env}
    result = runner.invoke(app, ["policy", "list"], env=env)
    return result.exit_code, " ".join(result.output.split())


def test_a_cluster_scheme_url_names_the_setting_to_use(tmp_path):
    code, out = _list(tmp_path, ARLOOP_REDIS_URL="redis+cluster://127.0.0.1:7000")
    assert code == 2 and "Traceback" not in out, out
    assert "give any node of the cluster as redis://host:port" in out, out
    assert "ARLOOP_REDIS_CLUSTER=true" in out, out


def test_cluster_mode_needs_a_url(tmp_path):
    code, out = _list(tmp_path, ARLOOP_REDIS_CLUSTER="true", ARLOOP_REDIS_URL="")
    assert code == 2 and "ARLOOP_REDIS_CLUSTER=true needs ARLOOP_REDIS_URL" in out, out


def test_cluster_mode_on_a_plain_redis_says_so(redis_url, tmp_path):
    code, out = _list(tmp_path, ARLOOP_REDIS_URL=redis_url, ARLOOP_REDIS_CLUSTER="true")
    assert code == 2 and "Traceback" not in out, out
    assert "is not a cluster (cluster_enabled:0): unset ARLOOP_REDIS_CLUSTER" in out, out


def test_a_plain_client_on_a_cluster_node_says_so(cluster_url, tmp_path):
    code, out = _list(tmp_path, ARLOOP_REDIS_URL=cluster_url, ARLOOP_REDIS_CLUSTER="false")
    assert code == 2 and "is a cluster node: set ARLOOP_REDIS_CLUSTER=true" in out, out


def test_policy_list_on_a_cluster(redis_cluster, cluster_url, tmp_path):
    PolicyRegistry(redis_cluster.client()).ensure_base("tiny")
    code, out = _list(tmp_path, ARLOOP_REDIS_URL=cluster_url, ARLOOP_REDIS_CLUSTER="true")
    assert code == 0 and "v0" in out and "champion" in out, out


def test_healthz_is_not_ready_once_the_cluster_is_down(start_api, tmp_path):
    try:
        own = start_cluster(tmp_path)
    except (OSError, TimeoutError) as exc:
        pytest.skip(f"a second Redis Cluster could not start: {exc}")
    try:
        api = start_api(redis_url=own.url, redis_cluster=True, redis_retries=0)
        assert api.http.get("/healthz").status_code == 200
    finally:
        own.stop()
    down = api.http.get("/healthz")
    assert down.status_code == 503 and "retry" in down.json()["detail"], down.text
