"""Issue 36, item 5: a Redis that refuses writes (full at maxmemory with noeviction, a
read-only replica) is a 503 naming why, with no internal key name; `/healthz` says not ready;
a run whose log is refused leaves no half-written thread; accepted feedback is never lost.

The Redis is real: the session's server with `maxmemory` set to one byte while a test needs it
full (restored after), and a second server made a replica of the first."""

from __future__ import annotations

import httpx
import pytest
import redis

from agents.events import STREAM_FEEDBACK, STREAM_TRAJECTORIES, THREAD_PREFIX
from deploy.embedded_redis import start_redis
from tests.fakes.scripted_llm import Reply
from tests.redis_cluster import _free_port as cluster_port


@pytest.fixture
def full(redis_client):
    """`fill()` makes Redis refuse every write that could grow it; undone after the test."""
    before = redis_client.config_get("maxmemory*")

    def fill() -> None:
        redis_client.config_set("maxmemory-policy", "noeviction")
        redis_client.config_set("maxmemory", "1")

    def drain() -> None:
        redis_client.config_set("maxmemory", before["maxmemory"])
        redis_client.config_set("maxmemory-policy", before["maxmemory-policy"])

    fill.drain = drain  # type: ignore[attr-defined]
    yield fill
    drain()


def threads(redis_client) -> list[bytes]:
    keys = redis_client.scan_iter(match=f"{THREAD_PREFIX}:*")
    return sorted(k for k in keys if not k.endswith(b":lock"))


def assert_refused_without_keys(reply: httpx.Response, why: str) -> None:
    assert reply.status_code == 503, reply.text
    assert why in reply.json()["detail"] and "arloop:" not in reply.text
    assert reply.headers["Retry-After"]


def test_a_full_redis_is_a_503_and_not_ready_and_keeps_the_feedback_it_took(
    start_api, llm, redis_client, full
):
    """Was: 500 "Redis refused a command ... OutOfMemoryError" showing key names, and
    `/healthz` 200 {"redis": "ok"}."""
    llm.responder = lambda request: Reply(content="ok")
    api = start_api()
    done = api.run("hi").json()
    assert api.http.get("/healthz").status_code == 200
    full()
    assert_refused_without_keys(api.run("hi again"), "full")
    assert_refused_without_keys(api.http.get("/healthz"), "full")
    rate = {"trajectory_id": done["trajectory_id"], "feedback_token": done["feedback_token"]}
    refused = api.feedback(**rate, kind="thumbs", value=1)
    assert refused.status_code == 503 and "nothing was written" in refused.json()["detail"]
    assert len(threads(redis_client)) == 1  # the refused run left no thread record
    full.drain()
    assert api.feedback(**rate, kind="thumbs", value=1).status_code == 202  # sent again: kept
    assert redis_client.xlen(STREAM_FEEDBACK) == 1
    assert api.http.get("/healthz").status_code == 200


def test_a_run_whose_log_is_refused_midway_leaves_its_thread_as_it_was(
    start_api, llm, redis_client, full
):
    """Redis fills while the model answers: the run's checkpoint or its trajectory is refused,
    and neither a new thread nor the next turn of an old one is left half-written."""
    llm.responder = lambda request: Reply(content="first answer")
    api = start_api()
    first = api.run("first question").json()
    before = api.http.get(f"/v1/threads/{first['thread_id']}", params={"user_id": "u1"}).json()

    def fills_then_answers(request) -> Reply:
        full()
        return Reply(content="an answer Redis will not take")

    llm.responder = fills_then_answers
    for thread in (None, first["thread_id"]):  # a new thread, then the old one
        extra = {"thread_id": thread} if thread else {}
        assert_refused_without_keys(api.run("second question", **extra), "full")
        full.drain()
    assert len(llm.requests) == 3  # the model did answer the two refused runs
    assert threads(redis_client) == [f"{THREAD_PREFIX}:{first['thread_id']}".encode()]
    after = api.http.get(f"/v1/threads/{first['thread_id']}", params={"user_id": "u1"}).json()
    assert after["messages"] == before["messages"]
    assert redis_client.xlen(STREAM_TRAJECTORIES) == 1


def test_a_read_only_replica_is_a_503_and_not_ready(start_api, llm, redis_server, tmp_path):
    llm.responder = lambda request: Reply(content="ok")
    replica = start_redis(
        tmp_path / "replica", extra=["--replicaof", "127.0.0.1", str(redis_server.port)]
    )
    try:
        client = redis.Redis.from_url(replica.url)
        assert client.config_get("replica-read-only")["replica-read-only"] == "yes"
        api = start_api(redis_url=replica.url)
        assert_refused_without_keys(api.run("hi"), "read-only replica")
        assert_refused_without_keys(api.http.get("/healthz"), "read-only replica")
        client.close()
    finally:
        replica.stop()


def test_a_cluster_node_is_a_503_naming_the_setting_and_not_ready(start_api, llm, tmp_path):
    """Was: a green `/healthz` while every run answered 500 with `MOVED` or `CLUSTERDOWN`
    (one plain client cannot follow a cluster: issue 34 builds that)."""
    llm.responder = lambda request: Reply(content="ok")
    node = start_redis(
        tmp_path / "node",
        cluster_port(),  # a cluster node's bus port is its port + 10000: 55535 at most
        extra=["--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf"],
    )
    try:
        api = start_api(redis_url=node.url)
        assert_refused_without_keys(api.run("hi"), "cluster")
        assert_refused_without_keys(api.http.get("/healthz"), "cluster")
    finally:
        node.stop()
