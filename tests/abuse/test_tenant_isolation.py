"""Issue 36, items 1-3: every read is scoped to the caller, a feedback token answers for its own
tenant's user only, and a user id never reaches Redis, an export or a token in clear; one
user's data can be erased.

Tenants `acme` and `beta` each have a backend key (identity `any`); acme also has a key bound
to one person (`alice`)."""

from __future__ import annotations

import base64
import json

import pytest

from agents.events import FORGET_REQUESTS, RATE_PREFIX, STREAM_FEEDBACK, STREAM_TRAJECTORIES, decode
from tests.fakes.scripted_llm import Reply

EMAIL = "alice.smith@example.org"
KEYS = [
    {"key": "k-acme", "name": "acme-backend", "tenant": "acme"},
    {"key": "k-beta", "name": "beta-backend", "tenant": "beta"},
    {"key": "k-alice", "name": "alice-phone", "tenant": "acme", "identity": "user", "user": EMAIL},
]


@pytest.fixture
def api(start_api, llm):
    llm.responder = lambda request: Reply(content="Rest, drink fluids.")
    return start_api(api_keys=KEYS, key_rate_per_minute=1000)


def auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def run(api, key: str, user: str | None, text: str = "I have a sore throat") -> dict:
    body = {"input": text} | ({"user_id": user} if user else {})
    reply = api.http.post("/v1/agents/tutor/runs", json=body, headers=auth(key))
    assert reply.status_code == 200, reply.text
    return reply.json()


def correct(api, key: str, done: dict, text: str = "see a doctor if it lasts") -> int:
    body = {
        "trajectory_id": done["trajectory_id"],
        "feedback_token": done["feedback_token"],
        "kind": "correction",
        "text": text,
    }
    return api.http.post("/v1/feedback", json=body, headers=auth(key)).status_code


def listed(api, key: str) -> list[str]:
    reply = api.http.get("/v1/feedback", headers=auth(key))
    assert reply.status_code == 200, reply.text
    return [item["trajectory_id"] for item in reply.json()["items"]]


def exported(api, key: str) -> list[dict]:
    reply = api.http.get("/v1/feedback/export", headers=auth(key))
    assert reply.status_code == 200, reply.text
    return [json.loads(line) for line in reply.text.splitlines()]


def test_another_tenants_key_reads_none_of_its_runs_or_feedback(api):
    """Was: tenant B's key got tenant A's triage run and correction, messages included."""
    acme = run(api, "k-acme", "patient-7")
    beta = run(api, "k-beta", "patient-9")
    assert correct(api, "k-acme", acme) == 202 and correct(api, "k-beta", beta) == 202
    assert listed(api, "k-acme") == [acme["trajectory_id"]]
    assert listed(api, "k-beta") == [beta["trajectory_id"]]
    lines = exported(api, "k-beta")
    assert [line["trajectory"]["event_id"] for line in lines] == [beta["trajectory_id"]]
    assert [f["trajectory_id"] for f in lines[0]["feedback"]] == [beta["trajectory_id"]]


def test_a_key_bound_to_one_user_reads_that_users_runs_only(api):
    mine = run(api, "k-alice", EMAIL)
    neighbour = run(api, "k-acme", "patient-7")  # same tenant, another person
    assert correct(api, "k-alice", mine) == 202 and correct(api, "k-acme", neighbour) == 202
    assert listed(api, "k-alice") == [mine["trajectory_id"]]
    assert [x["trajectory"]["event_id"] for x in exported(api, "k-alice")] == [
        mine["trajectory_id"]
    ]
    assert sorted(listed(api, "k-acme")) == sorted(
        [mine["trajectory_id"], neighbour["trajectory_id"]]
    )


def test_another_tenants_token_is_refused_with_or_without_a_user_id(api, redis_client):
    """Was: 202 without `user_id` (`Caller.user(None)` skipped the check)."""
    acme = run(api, "k-acme", "patient-7")
    assert correct(api, "k-beta", acme) == 403
    body = {
        "trajectory_id": acme["trajectory_id"],
        "feedback_token": acme["feedback_token"],
        "kind": "thumbs",
        "value": -1,
        "user_id": "patient-7",
    }
    assert api.http.post("/v1/feedback", json=body, headers=auth("k-beta")).status_code == 403
    assert redis_client.xlen(STREAM_FEEDBACK) == 0
    assert correct(api, "k-acme", acme) == 202


def every_byte(redis_client, but: tuple[str, ...] = ()) -> bytes:
    """Every key name and every value Redis holds (but keys starting so), concatenated."""
    out = []
    for key in redis_client.scan_iter(count=1000):
        if key.decode().startswith(but):
            continue
        out.append(key)
        kind = redis_client.type(key)
        if kind == b"string":
            out.append(redis_client.get(key))
        elif kind == b"hash":
            out += [b for kv in redis_client.hgetall(key).items() for b in kv]
        elif kind == b"list":
            out += redis_client.lrange(key, 0, -1)
        elif kind == b"set":
            out += list(redis_client.smembers(key))
        elif kind == b"zset":
            out += redis_client.zrange(key, 0, -1)
        elif kind == b"stream":
            out += [b for _, f in redis_client.xrange(key) for kv in f.items() for b in kv]
    return b"\n".join(out)


def test_a_user_id_is_stored_and_handed_out_only_as_a_pseudonym(api, redis_client):
    """Was: an email address in Redis key names, the streams, the export and the token."""
    done = run(api, "k-alice", EMAIL)
    assert correct(api, "k-alice", done) == 202
    run(api, "k-acme", EMAIL)  # the backend names the same person
    stored = api.stored(EMAIL, "acme")
    assert {decode(f).user_id for _, f in redis_client.xrange(STREAM_TRAJECTORIES)} == {stored}
    assert stored.startswith("acme:u_") and EMAIL not in stored
    everything = every_byte(redis_client)
    assert stored.encode() in everything  # the check can see the pseudonym: it looks everywhere
    for part in (EMAIL, "alice.smith", "example.org"):
        assert part.encode() not in everything
    token = done["feedback_token"]
    assert EMAIL.encode() not in base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
    assert EMAIL not in api.http.get("/v1/feedback/export", headers=auth("k-acme")).text
    assert EMAIL not in api.http.get("/v1/feedback", headers=auth("k-acme")).text


def test_a_user_can_be_erased_and_no_one_else_is_touched(api, redis_client):
    mine = run(api, "k-acme", "patient-7")
    again = run(api, "k-acme", "patient-7", text="still sore")
    other = run(api, "k-acme", "patient-8")
    beta_same_name = run(api, "k-beta", "patient-7")
    for done, key in ((mine, "k-acme"), (other, "k-acme"), (beta_same_name, "k-beta")):
        assert correct(api, key, done) == 202
    refused = api.http.delete("/v1/users/patient-7", headers=auth("k-alice"))
    assert refused.status_code == 403  # a key bound to alice erases alice only

    erased = api.http.delete("/v1/users/patient-7", headers=auth("k-acme"))
    assert erased.status_code == 200, erased.text
    assert erased.json() == {"user_id": "patient-7", "threads": 2, "memories": 0, "events": 3}
    gone = api.stored("patient-7", "acme")
    # the erasure request, and rate windows (counters that expire within two minutes)
    assert gone.encode() not in every_byte(redis_client, but=(FORGET_REQUESTS, RATE_PREFIX))
    assert redis_client.hexists(FORGET_REQUESTS, gone)  # the learner erases its copy next
    for thread in (mine["thread_id"], again["thread_id"]):
        seen = api.http.get(
            f"/v1/threads/{thread}", params={"user_id": "patient-7"}, headers=auth("k-acme")
        )
        assert seen.status_code == 404
    assert listed(api, "k-acme") == [other["trajectory_id"]]
    assert listed(api, "k-beta") == [beta_same_name["trajectory_id"]]  # beta's patient-7 stays
    assert run(api, "k-acme", "patient-7")["output"]  # the user may come back


def test_erasures_are_rate_limited_per_user(api):
    """An erasure scans the streams: at most 6 a minute for one user."""
    api.hold_rate_window()
    statuses = [
        api.http.delete("/v1/users/patient-7", headers=auth("k-acme")).status_code for _ in range(7)
    ]
    assert statuses == [200] * 6 + [429]
    assert api.http.delete("/v1/users/patient-8", headers=auth("k-acme")).status_code == 200
