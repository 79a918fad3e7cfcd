"""Who may act as whom: a user_id is bound to the credential that sends it.

The defect: `user_id` was whatever the client sent, so one API key posing as 130 users got
no 429 and each fake user had its own share of the reward cap. Now a key is limited as a
whole, may be bound to one user, to a user token its app signs, or to a gateway's header,
and users of different tenants never meet.
"""

from __future__ import annotations

import pytest

from agents.events import STREAM_FEEDBACK, STREAM_TRAJECTORIES, decode
from deploy.credentials import sign_user_token
from tests.fakes.api import API_KEY
from tests.fakes.scripted_llm import Reply

USER_SECRET = "user-token-secret-" + "z" * 30
KEYS = [
    API_KEY,
    {"key": "k-alice", "name": "alice-phone", "identity": "user", "user": "alice"},
    {"key": "k-app", "name": "web-app", "tenant": "acme", "identity": "signed"},
    {"key": "k-gateway", "name": "gateway", "tenant": "beta", "identity": "header"},
]


@pytest.fixture
def api(start_api, llm):
    llm.responder = lambda request: Reply(content="ok")
    return start_api(api_keys=KEYS, user_token_secret=USER_SECRET, key_rate_per_minute=100)


def as_key(api, key: str, body: dict, **headers):
    auth = {"Authorization": f"Bearer {key}", **headers}
    return api.http.post("/v1/agents/tutor/runs", json=body, headers=auth)


def logged_users(redis_client) -> list[str]:
    return [decode(f).user_id for _, f in redis_client.xrange(STREAM_TRAJECTORIES)]


def test_one_key_posing_as_130_users_meets_the_keys_own_limit(api):
    api.hold_rate_window()
    statuses = [api.run("hi", user=f"fake{n}").status_code for n in range(130)]
    assert statuses[:100] == [200] * 100  # each fake user is far under its own limit
    assert set(statuses[100:]) == {429}
    refused = api.run("hi", user="fake999")
    assert refused.status_code == 429 and "key 'key-" in refused.json()["detail"]
    assert refused.headers["Retry-After"]


def test_a_key_bound_to_one_user_cannot_speak_for_another(api, redis_client):
    own = as_key(api, "k-alice", {"input": "hi", "user_id": "alice"})
    other = as_key(api, "k-alice", {"input": "hi", "user_id": "bob"})
    assert own.status_code == 200
    assert other.status_code == 403 and "acts as user 'alice'" in other.json()["detail"]
    assert logged_users(redis_client) == [api.stored("alice")]


def test_a_signed_user_token_names_the_user_and_nothing_else_does(api, redis_client):
    body = {"input": "hi", "user_id": "carol"}
    good = sign_user_token(USER_SECRET, "carol")
    forged = sign_user_token("another-secret-" + "q" * 30, "carol")
    assert as_key(api, "k-app", body).status_code == 401
    assert as_key(api, "k-app", body, **{"X-Arloop-User": forged}).status_code == 401
    expired = sign_user_token(USER_SECRET, "carol", ttl_s=-10)
    assert "expired" in as_key(api, "k-app", body, **{"X-Arloop-User": expired}).text
    mallory = as_key(api, "k-app", {"input": "hi", "user_id": "dave"}, **{"X-Arloop-User": good})
    assert mallory.status_code == 403
    assert as_key(api, "k-app", body, **{"X-Arloop-User": good}).status_code == 200
    assert logged_users(redis_client) == [api.stored("carol", "acme")]  # tenant-scoped


def test_tenants_never_share_a_user(api, redis_client):
    """`u1` of tenant acme (signed) and `u1` of tenant beta (gateway) are two people: neither
    reads the other's thread, and the events keep them apart."""
    acme = as_key(
        api,
        "k-app",
        {"input": "hi", "user_id": "u1"},
        **{"X-Arloop-User": sign_user_token(USER_SECRET, "u1")},
    )
    thread = acme.json()["thread_id"]
    beta = {"Authorization": "Bearer k-gateway", "X-Forwarded-User": "u1"}
    seen = api.http.get(f"/v1/threads/{thread}", params={"user_id": "u1"}, headers=beta)
    assert seen.status_code == 404
    assert as_key(api, "k-gateway", {"input": "hi", "user_id": "u1"}).status_code == 401
    ran = api.http.post(
        "/v1/agents/tutor/runs", json={"input": "hi", "user_id": "u1"}, headers=beta
    )
    assert ran.status_code == 200
    assert logged_users(redis_client) == [api.stored("u1", "acme"), api.stored("u1", "beta")]


def test_feedback_is_bound_to_the_same_user_and_counted_per_key(api, start_api, redis_client):
    run = as_key(api, "k-alice", {"input": "hi", "user_id": "alice"}).json()
    token = run["feedback_token"]
    rate = {"trajectory_id": run["trajectory_id"], "feedback_token": token, "kind": "rating"}
    as_other = api.http.post(
        "/v1/feedback",
        json=rate | {"value": 5, "user_id": "bob"},
        headers={"Authorization": "Bearer k-alice"},
    )
    assert as_other.status_code == 403
    given = api.http.post(
        "/v1/feedback", json=rate | {"value": 5}, headers={"Authorization": "Bearer k-alice"}
    )
    assert given.status_code == 202
    [(_, fields)] = redis_client.xrange(STREAM_FEEDBACK)
    event = decode(fields)
    assert (event.user_id, event.credential) == (api.stored("alice"), "alice-phone")


def test_feedback_of_one_key_for_many_users_meets_the_keys_limit(start_api, llm):
    llm.responder = lambda request: Reply(content="ok")
    api = start_api(api_keys=[API_KEY], key_rate_per_minute=10, run_rate_per_minute=1000)
    api.hold_rate_window()
    runs = [api.run("hi", user=f"fake{n}").json() for n in range(6)]  # runs: under 10 too
    statuses = []
    for run in runs * 2:
        kind = "thumbs" if len(statuses) < 6 else "rating"
        value = 1 if kind == "thumbs" else 5
        reply = api.feedback(
            trajectory_id=run["trajectory_id"],
            feedback_token=run["feedback_token"],
            kind=kind,
            value=value,
        )
        statuses.append(reply.status_code)
    assert statuses[:4] == [202] * 4 and statuses[-1] == 429
