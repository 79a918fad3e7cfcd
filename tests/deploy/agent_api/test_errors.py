"""Bad input and faults through the agent API: a 4xx/5xx with a reason, nothing half-written."""

from __future__ import annotations

import threading
import time

import httpx
import pytest
import redis

from agents.errors import ArloopError
from agents.events import STREAM_FEEDBACK, STREAM_TRAJECTORIES
from agents.feedback_intake import FeedbackRejected
from agents.feedback_tokens import TokenClaims, TokenError, issue, sign
from agents.policy_client import PolicyError
from agents.runtime import UnknownAgent
from agents.threads import ThreadError
from deploy.agent_api.chat_wire import OpenAIError
from deploy.agent_api.errors import Unauthorized
from deploy.agent_api.limits import RateLimited
from deploy.embedded_redis import free_port, start_redis
from tests.fakes.api import SECRET
from tests.fakes.scripted_llm import Reply


@pytest.fixture
def api(start_api, llm):
    llm.responder = lambda request: Reply(content="ok")
    return start_api()


def ran(api) -> dict:
    reply = api.run("hello")
    assert reply.status_code == 200, reply.text
    return reply.json()


@pytest.mark.parametrize(
    "body, status, reason",
    [
        (b"{not json", 422, "JSON decode error"),
        (b'{"input": "hi"}', 422, "user_id"),
        (b'{"input": "", "user_id": "u1"}', 422, "at least 1 character"),
        (b'{"input": "hi", "user_id": "u1", "colour": "red"}', 422, "Extra inputs"),
        (b'{"input": "hi", "user_id": "u 1"}', 422, "should match pattern"),
        (b'{"input": "hi", "user_id": "u1", "thread_id": "a:b"}', 422, "should match pattern"),
        (b'{"input": 7, "user_id": "u1"}', 422, "valid string"),
        (
            b'{"input": "hi", "user_id": "u1", "metadata": {"arloop.verdict": "pass"}}',
            422,
            "arloop",
        ),
        (b'{"input": "hi", "user_id": "u1", "metadata": {"k": 1}}', 422, "valid string"),
        (b"[]", 422, "valid dictionary"),
    ],
)
def test_malformed_run_bodies_are_422_with_a_reason(api, redis_client, body, status, reason):
    reply = api.http.post(
        "/v1/agents/tutor/runs", content=body, headers={"Content-Type": "application/json"}
    )
    assert reply.status_code == status and reason in reply.text
    assert redis_client.xlen(STREAM_TRAJECTORIES) == 0


def test_unknown_agent_oversized_input_and_body_too_large(start_api, llm, redis_client):
    api = start_api(max_input_chars=50, max_body_bytes=2000)
    missing = api.run("hi", agent="oracle")
    assert missing.status_code == 404 and "tutor, solver" in missing.json()["detail"]
    long = api.run("x" * 51)
    assert long.status_code == 413 and "limit is 50" in long.json()["detail"]
    huge = api.http.post("/v1/agents/tutor/runs", content=b"x" * 5000)
    assert huge.status_code == 413 and "ARLOOP_MAX_BODY_BYTES" in huge.json()["detail"]

    def chunks():
        for _ in range(10):
            yield b"y" * 500

    streamed = api.http.post("/v1/agents/tutor/runs", content=chunks())  # no Content-Length
    assert streamed.status_code == 413
    assert llm.requests == [] and redis_client.xlen(STREAM_TRAJECTORIES) == 0


def test_runs_need_a_key(api):
    reply = api.http.post(
        "/v1/agents/tutor/runs",
        json={"input": "hi", "user_id": "u1"},
        headers={"Authorization": "Basic abc"},
    )
    assert reply.status_code == 401 and reply.headers["WWW-Authenticate"] == "Bearer"


def test_another_users_thread_is_403(api):
    mine = ran(api)
    theirs = api.run("let me in", user="u2", thread_id=mine["thread_id"])
    assert theirs.status_code == 403 and "another user" in theirs.json()["detail"]
    other_agent = api.run("hi", agent="solver", thread_id=mine["thread_id"])
    assert other_agent.status_code == 409 and "agent 'tutor'" in other_agent.json()["detail"]


def test_a_busy_thread_is_409(start_api, llm):
    llm.push(Reply(content="slow", delay_s=1.5), Reply(content="fast"))
    api = start_api()
    slow: list[httpx.Response] = []
    first = threading.Thread(target=lambda: slow.append(api.run("one", thread_id="th-busy")))
    first.start()
    while not llm.requests:
        time.sleep(0.01)
    busy = api.run("two", thread_id="th-busy")
    first.join()
    assert busy.status_code == 409 and "retry" in busy.json()["detail"]
    assert slow[0].status_code == 200
    assert api.run("three", thread_id="th-busy").status_code == 200  # the lock was released


def feedback_for(api, body: dict, **fields) -> httpx.Response:
    base = {
        "trajectory_id": body["trajectory_id"],
        "feedback_token": body["feedback_token"],
        "kind": "thumbs",
        "value": 1,
    }
    return api.feedback(**{k: v for k, v in (base | fields).items() if v is not None})


def test_feedback_token_faults(api, redis_client):
    body, other = ran(api), ran(api)
    token = body["feedback_token"]
    altered = token[:-3] + ("AAA" if not token.endswith("AAA") else "BBB")
    past = int(time.time()) - 1
    expired = sign(SECRET, TokenClaims(body["trajectory_id"], "u1", "fake-v0", past))
    foreign = issue("x" * 40, body["trajectory_id"], "u1", "v", 60)
    cases = [
        ({"feedback_token": None}, 401, "missing"),
        ({"feedback_token": altered}, 401, "not valid"),
        ({"feedback_token": expired}, 401, "expired"),
        ({"feedback_token": foreign}, 401, "not valid"),
        ({"feedback_token": other["feedback_token"]}, 403, "another trajectory"),
        ({"user_id": "u2"}, 403, "another user"),
    ]
    for fields, status, reason in cases:
        reply = feedback_for(api, body, **fields)
        assert (reply.status_code, reason in reply.json()["detail"]) == (status, True), fields
    assert redis_client.xlen(STREAM_FEEDBACK) == 0
    assert feedback_for(api, body).status_code == 202  # the genuine token still works


@pytest.mark.parametrize(
    "fields, reason",
    [
        ({"kind": "rating", "value": 7}, "from 1 to 5"),
        ({"kind": "thumbs", "value": 0}, "1 (up) or -1"),
        ({"kind": "outcome", "value": 1.5}, "from 0 to 1"),
        ({"kind": "correction", "value": None, "text": "  "}, "non-empty text"),
        ({"kind": "verifier", "value": 1}, "kind must be one of"),
        ({"kind": "stars", "value": 1}, "kind must be one of"),
    ],
)
def test_feedback_values_out_of_range_are_422(api, redis_client, fields, reason):
    reply = feedback_for(api, ran(api), **fields)
    assert reply.status_code == 422 and reason in reply.json()["detail"]
    assert redis_client.xlen(STREAM_FEEDBACK) == 0


def test_malformed_feedback_bodies_are_422(api):
    for body in [
        b"{",
        b'{"kind": "thumbs"}',
        b'{"trajectory_id": "t", "kind": "thumbs", "x": 1}',
        b'{"trajectory_id": "t", "kind": "thumbs", "value": "up"}',
    ]:
        reply = api.http.post(
            "/v1/feedback", content=body, headers={"Content-Type": "application/json"}
        )
        assert reply.status_code == 422, body


def test_rate_limits_are_429_per_user(start_api, llm):
    llm.responder = lambda request: Reply(content="ok")
    api = start_api(run_rate_per_minute=2, feedback_rate_per_minute=1)
    api.hold_rate_window()
    body = ran(api)
    ran(api)
    limited = api.run("third")
    assert limited.status_code == 429 and int(limited.headers["Retry-After"]) >= 1
    assert "2 per minute" in limited.json()["detail"]
    assert api.run("another user is fine", user="u2").status_code == 200
    assert feedback_for(api, body).status_code == 202
    second = feedback_for(api, body, kind="rating", value=4)
    assert second.status_code == 429 and "Retry-After" in second.headers


def test_model_endpoint_errors_are_502_and_timeouts_504(start_api, llm, redis_client):
    api = start_api(policy_timeout_s=0.5)
    llm.push(Reply(status=500))
    failed = api.run("hi", thread_id="th-model")
    assert failed.status_code == 502 and "policy endpoint failed" in failed.json()["detail"]
    llm.push(Reply(content="late", delay_s=2))
    slow = api.run("hi", thread_id="th-model")
    assert slow.status_code == 504 and "timed out" in slow.json()["detail"]
    assert redis_client.xlen(STREAM_TRAJECTORIES) == 0
    llm.push(Reply(content="back"))
    assert api.run("again", thread_id="th-model").json()["output"] == "back"
    assert [m["content"] for m in llm.requests[-1]["messages"][1:]] == ["again"]  # rolled back


def test_redis_outage_is_503_and_the_service_recovers(start_api, llm, tmp_path):
    llm.responder = lambda request: Reply(content="ok")
    port = free_port()
    server = start_redis(tmp_path / "redis", port)
    try:
        api = start_api(redis_url=server.url)
        body = ran(api)
        server.stop()
        down = api.run("hello?")
        assert down.status_code == 503 and "Redis is unavailable" in down.json()["detail"]
        assert api.http.get("/healthz").status_code == 503
        assert feedback_for(api, body).status_code == 503
        server = start_redis(tmp_path / "redis", port)
        assert api.http.get("/healthz").status_code == 200
        assert ran(api)["output"] == "ok"
        assert feedback_for(api, body).status_code == 202
        with redis.Redis.from_url(server.url) as r:
            assert r.xlen(STREAM_TRAJECTORIES) == 2 and r.xlen(STREAM_FEEDBACK) == 1
    finally:
        server.stop()


def test_no_500_for_junk_paths_and_methods(api):
    assert api.http.get("/v1/agents/tutor/runs").status_code == 405
    assert api.http.post("/v1/nothing").status_code == 404


ERRORS = [
    (TokenError(401, "feedback_token has expired"), 401, {}),
    (TokenError(403, "feedback_token belongs to another user"), 403, {}),
    (ThreadError(409, "thread 'th1' is running another request"), 409, {}),
    (FeedbackRejected(422, "rating takes a value from 1 to 5"), 422, {}),
    (FeedbackRejected(429, "too much feedback", retry_after=7), 429, {"retry-after": "7"}),
    (RateLimited("too many runs", retry_after=30), 429, {"retry-after": "30"}),
    (UnknownAgent("oracle", ["tutor"]), 404, {}),
    (PolicyError(504, "policy endpoint timed out after 5 s"), 504, {}),
    (Unauthorized("unknown API key"), 401, {"www-authenticate": "Bearer"}),
    (ArloopError(413, "input is over the limit", retry_after=None), 413, {}),
    (OpenAIError(409, "run 'r1' is closed (ended)", param="X-Arloop-Run"), 409, {}),
]


@pytest.mark.parametrize(
    "error, status, headers", ERRORS, ids=[f"{type(e).__name__}-{s}" for e, s, _ in ERRORS]
)
def test_one_handler_answers_every_arloop_error(start_api, llm, error, status, headers):
    async def fail():
        raise error

    api = start_api(extend=lambda app: app.add_api_route("/test/fail", fail))
    reply = api.http.get("/test/fail")
    assert (reply.status_code, reply.json()) == (status, {"detail": error.reason})
    assert {k: reply.headers.get(k) for k in headers} == headers
    if not headers:
        assert "retry-after" not in reply.headers
    assert f'arloop_http_errors_total{{status="{status}"}} 1.0' in api.http.get("/metrics").text


def test_every_arloop_error_of_the_agent_api_has_a_case():
    def subclasses(cls: type) -> set[type]:
        return {s for c in cls.__subclasses__() for s in {c, *subclasses(c)}}

    served_here = {
        c
        for c in subclasses(ArloopError)
        if c.__module__.startswith(("agents.", "deploy.agent_api"))
    }
    assert served_here <= {type(e) for e, _, _ in ERRORS}
