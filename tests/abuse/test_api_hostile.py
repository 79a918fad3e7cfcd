"""Hostile input to the agent API: every body gets a 4xx with a reason, never a 500.

NaN, Infinity and 1e99999999 (JSON that Python reads as infinity), lone surrogates, deep
nesting, huge integers, invalid UTF-8 and 20 MB bodies, each to the route that reads it.
"""

from __future__ import annotations

import pytest

from agents.events import STREAM_FEEDBACK, STREAM_TRAJECTORIES
from tests.fakes.scripted_llm import Reply

FEEDBACK = b'{"trajectory_id": "t", "feedback_token": "x", '
DEEP = b"[" * 100_000 + b"]" * 100_000
HOSTILE_FEEDBACK = {
    "NaN": (FEEDBACK + b'"kind": "rating", "value": NaN}', 422, "finite number"),
    "Infinity": (FEEDBACK + b'"kind": "rating", "value": Infinity}', 422, "finite number"),
    "-Infinity": (FEEDBACK + b'"kind": "rating", "value": -Infinity}', 422, "finite number"),
    "1e99999999": (FEEDBACK + b'"kind": "rating", "value": 1e99999999}', 422, "finite number"),
    "turn 1e400": (FEEDBACK + b'"kind": "rating", "value": 1, "turn": 1e400}', 422, "finite"),
    "surrogate text": (FEEDBACK + b'"kind": "correction", "text": "\\ud800"}', 422, "unicode"),
    "surrogate kind": (FEEDBACK + b'"kind": "\\udfff", "value": 1}', 422, "unicode"),
    "surrogate id": (
        b'{"trajectory_id": "\\ud800", "feedback_token": "x", "kind": "rating", "value": 1}',
        422,
        "unicode",
    ),
    "deep": (b'{"trajectory_id": ' + DEEP + b"}", 400, "nested too deeply"),
    "huge integer": (FEEDBACK + b'"kind": "rating", "value": ' + b"9" * 5000 + b"}", 400, "digits"),
    "invalid UTF-8": (b'{"trajectory_id": "\xff\xfe"}', 400, "UTF-8"),
}
HOSTILE_RUNS = {
    "NaN input": (b'{"input": NaN, "user_id": "u1"}', 422, "valid string"),
    "surrogate input": (b'{"input": "\\ud800", "user_id": "u1"}', 422, "unicode"),
    "surrogate user": (b'{"input": "hi", "user_id": "\\udbff"}', 422, "unicode"),
    "surrogate metadata key": (
        b'{"input": "hi", "user_id": "u1", "metadata": {"\\ud800": "x"}}',
        422,
        "unicode",
    ),
    "deep metadata": (
        b'{"input": "hi", "user_id": "u1", "metadata": ' + b'{"a": ' * 5000 + b"1" + b"}" * 5001,
        400,
        "nested too deeply",
    ),
}


@pytest.fixture
def api(start_api, llm):
    llm.responder = lambda request: Reply(content="ok")
    return start_api()


def _reason(reply) -> str:
    detail = reply.json()["detail"]
    return detail if isinstance(detail, str) else " ".join(e["msg"] for e in detail)


def _post(api, path: str, body: bytes):
    return api.http.post(path, content=body, headers={"Content-Type": "application/json"})


@pytest.mark.parametrize("case", list(HOSTILE_FEEDBACK))
def test_hostile_feedback_is_a_4xx_with_a_reason(api, redis_client, case):
    body, status, reason = HOSTILE_FEEDBACK[case]
    reply = _post(api, "/v1/feedback", body)
    assert reply.status_code == status, reply.text
    assert reason.lower() in _reason(reply).lower()
    assert redis_client.xlen(STREAM_FEEDBACK) == 0


@pytest.mark.parametrize("case", list(HOSTILE_RUNS))
def test_hostile_run_bodies_are_a_4xx_with_a_reason(api, llm, redis_client, case):
    body, status, reason = HOSTILE_RUNS[case]
    reply = _post(api, "/v1/agents/tutor/runs", body)
    assert reply.status_code == status, reply.text
    assert reason.lower() in _reason(reply).lower()
    assert llm.requests == [] and redis_client.xlen(STREAM_TRAJECTORIES) == 0


def test_twenty_megabyte_bodies_are_refused_and_the_api_keeps_serving(api):
    big = b'{"input": "' + b"x" * (20 << 20) + b'", "user_id": "u1"}'
    declared = _post(api, "/v1/agents/tutor/runs", big)
    streamed = api.http.post(
        "/v1/feedback", content=(big[i : i + (1 << 20)] for i in range(0, len(big), 1 << 20))
    )
    for reply in (declared, streamed):
        assert reply.status_code == 413 and "ARLOOP_MAX_BODY_BYTES" in reply.json()["detail"]
    assert api.run("hello").status_code == 200
    metrics = api.http.get("/metrics").text
    assert 'arloop_http_errors_total{status="500"}' not in metrics
