"""`POST /v1/feedback` served before routing (deploy/agent_api/ingest.py) answers exactly as the
FastAPI route does: the same posts to an app with the fast path and to one without it get the
same statuses and bodies, and each app really took the path it was meant to."""

from __future__ import annotations

import json
import time

import pytest
import redis

import deploy.agent_api.app as app_module
from agents.events import STREAM_FEEDBACK, decode
from agents.feedback_tokens import TokenClaims, issue, sign
from deploy.agent_api.ingest import FeedbackFastPath
from tests.fakes.api import SECRET


def _without_fast_path(app) -> None:
    app.user_middleware = [m for m in app.user_middleware if m.cls is not FeedbackFastPath]


def _posts() -> list[tuple[str, dict | bytes, dict[str, str]]]:
    """(what it is, the body, extra headers) in the order they are sent."""
    good = issue(SECRET, "traj_a", "u1", "v3", 600, agent="tutor")
    other = issue(SECRET, "traj_b", "u1", "v3", 600, agent="tutor")
    expired = sign(SECRET, TokenClaims("traj_c", "u1", "v3", int(time.time()) - 5, "tutor"))
    thumbs = {"trajectory_id": "traj_a", "feedback_token": good, "kind": "thumbs", "value": 1}
    json_type = {"Content-Type": "application/json"}
    return [
        ("accepted", thumbs, {}),
        ("a replay", thumbs, {}),
        ("a rating out of range", thumbs | {"kind": "rating", "value": 7}, {}),
        ("a value the kind does not take", thumbs | {"value": 0.5}, {}),
        ("a correction", thumbs | {"kind": "correction", "value": None, "text": "It is 5."}, {}),
        ("a named score", thumbs | {"kind": None, "value": None, "key": "clarity", "score": 4}, {}),
        ("someone else's token", {**thumbs, "trajectory_id": "traj_b"}, {}),
        (
            "another user's run",
            {**thumbs, "feedback_token": other, "trajectory_id": "traj_b", "user_id": "u2"},
            {},
        ),
        ("an expired token", {**thumbs, "trajectory_id": "traj_c", "feedback_token": expired}, {}),
        ("no token", {**thumbs, "feedback_token": None}, {}),
        ("an unknown field", thumbs | {"stars": 5}, {}),
        ("NaN", b'{"trajectory_id": "traj_a", "kind": "thumbs", "value": NaN}', json_type),
        (
            "1e99999999",
            b'{"trajectory_id": "traj_a", "kind": "rating", "value": 1e99999999}',
            json_type,
        ),
        (
            "a lone surrogate",
            b'{"trajectory_id": "traj_a", "kind": "correction", "text": "\\ud800"}',
            json_type,
        ),
        ("broken JSON", b'{"trajectory_id": ', json_type),
        ("deep nesting", b'{"text": ' + b"[" * 5000 + b"]" * 5000 + b"}", json_type),
        ("not JSON's content type", json.dumps(thumbs).encode(), {"Content-Type": "text/plain"}),
        ("an unknown API key", thumbs, {"Authorization": "Bearer nope"}),
        ("no API key", thumbs, {"Authorization": ""}),
    ]


@pytest.fixture
def route_calls(monkeypatch) -> list[str]:
    """Calls of the route's own `take_feedback` (the fast path holds its own reference)."""
    calls: list[str] = []
    real = app_module.take_feedback

    async def counted(caller, body):
        calls.append(body.trajectory_id)
        return await real(caller, body)

    monkeypatch.setattr(app_module, "take_feedback", counted)
    return calls


def test_the_fast_path_answers_every_post_as_the_route_does(start_api, redis_url, route_calls):
    fast_url, routed_url = redis_url.rsplit("/", 1)[0] + "/1", redis_url.rsplit("/", 1)[0] + "/2"
    fast = start_api(redis_url=fast_url)
    routed = start_api(redis_url=routed_url, extend=_without_fast_path)
    posts = _posts()  # once: both apps get the very same bytes (tokens carry their expiry)
    answers, took_route = {}, {}
    for name, api in (("fast", fast), ("routed", routed)):
        calls_before = len(route_calls)
        for what, body, headers in posts:
            sent = {"json": body} if isinstance(body, dict) else {"content": body}
            reply = api.http.post("/v1/feedback", headers=headers, **sent)
            answers.setdefault(what, {})[name] = (reply.status_code, reply.json())
        took_route[name] = len(route_calls) - calls_before

    for what, by_path in answers.items():
        assert by_path["fast"] == by_path["routed"], what
    statuses = {what: by_path["fast"][0] for what, by_path in answers.items()}
    assert statuses["accepted"] == statuses["a correction"] == statuses["a named score"] == 202
    assert statuses["a replay"] == 409 and statuses["an expired token"] == 401
    assert statuses["someone else's token"] == statuses["another user's run"] == 403
    assert statuses["a rating out of range"] == statuses["NaN"] == 422
    assert statuses["an unknown API key"] == 401
    # the route took none of the well-formed posts with the fast path, all 10 without it
    assert took_route == {"fast": 0, "routed": 10}

    for url in (fast_url, routed_url):
        with redis.Redis.from_url(url) as r:
            kinds = [decode(f).kind.value for _, f in r.xrange(STREAM_FEEDBACK)]
        assert kinds == ["thumbs", "correction", "score"], url
