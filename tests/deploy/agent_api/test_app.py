"""The agent API over real HTTP: runs, threads across restarts, trajectories, feedback, metrics."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import httpx

from agents.events import STREAM_FEEDBACK, STREAM_TRAJECTORIES, FeedbackEvent, decode
from agents.feedback_intake import feedback_event_id
from agents.feedback_tokens import verify
from deploy.credentials import plain_key
from deploy.embedded_redis import free_port
from tests.fakes.api import API_KEY, SECRET
from tests.fakes.scripted_llm import Reply


def stream(redis_client, name: str) -> list:
    return [decode(fields) for _, fields in redis_client.xrange(name)]


def test_agents_are_listed_to_key_holders_only(start_api):
    api = start_api()
    assert api.http.get("/v1/agents", headers={"Authorization": ""}).status_code == 401
    wrong = api.http.get("/v1/agents", headers={"Authorization": "Bearer nope"})
    assert wrong.status_code == 401 and wrong.json()["detail"] == "unknown API key"
    listed = api.http.get("/v1/agents").json()["agents"]
    assert [(a["name"], a["kind"], a["tools"]) for a in listed] == [
        ("tutor", "react", ["add"]),
        ("solver", "reflexion", ["add"]),
    ]
    assert api.http.get("/healthz").json() == {"status": "ok", "redis": "ok"}
    assert "/v1/feedback" in api.http.get("/openapi.json").json()["paths"]


def test_default_packs_serve_tutor_and_triage(start_api, llm):
    api = start_api(specs=None)
    listed = api.http.get("/v1/agents").json()["agents"]
    assert [(a["name"], a["kind"], a["tools"]) for a in listed] == [
        ("tutor", "react", ["calculator"]),
        ("tutor_hints", "react", []),
        ("triage", "reflexion", ["kb_search"]),
    ]
    llm.push(Reply(tool_calls=[("calculator", '{"expression": "12*12"}')]), Reply(content="144"))
    assert api.run("What is 12 times 12?").json()["output"] == "144"
    assert llm.requests[1]["messages"][-1]["content"] == "144"


def test_run_lands_in_redis_exactly_and_feedback_follows(start_api, llm, redis_client):
    llm.fingerprints = {"arloop@champion": "v4"}
    llm.push(Reply(tool_calls=[("add", '{"a": 2, "b": 3}')]), Reply(content="5"))
    api = start_api()
    reply = api.run("What is 2+3?", metadata={"task_id": "sum-1"})
    assert reply.status_code == 200, reply.text
    body = reply.json()
    assert (body["output"], body["policy_version"], body["status"]) == ("5", "v4", "ok")

    [event] = stream(redis_client, STREAM_TRAJECTORIES)
    assert event.trajectory_id == body["trajectory_id"] and event.thread_id == body["thread_id"]
    assert (event.input, event.output, event.user_id, event.agent) == (
        "What is 2+3?",
        "5",
        api.stored("u1"),
        "tutor",
    )
    credential = plain_key(API_KEY)["name"]  # the API key that started it, by name
    assert event.metadata == {"task_id": "sum-1", "arloop.credential": credential}
    assert [s.messages for s in event.model_steps] == [r["messages"] for r in llm.requests]
    assert [s.completion_token_ids for s in event.model_steps] == [
        r["choices"][0]["token_ids"] for r in llm.responses
    ]
    assert [s.prompt_token_ids for s in event.model_steps] == [
        r["prompt_token_ids"] for r in llm.responses
    ]
    assert event.tool_steps[0].output == "5"

    claims = verify(SECRET, body["feedback_token"])
    assert (claims.trajectory_id, claims.user_id, claims.policy_version) == (
        event.trajectory_id,
        api.stored("u1"),
        "v4",
    )
    token = body["feedback_token"]
    up = api.feedback(
        trajectory_id=event.trajectory_id,
        feedback_token=token,
        kind="thumbs",
        value=1,
        user_id="u1",
    )
    assert up.status_code == 202, up.text
    assert up.json()["event_id"] == feedback_event_id(event.trajectory_id, "thumbs")
    again = api.feedback(
        trajectory_id=event.trajectory_id, feedback_token=token, kind="thumbs", value=-1
    )
    assert again.status_code == 409 and up.json()["event_id"] in again.json()["detail"]
    fix = api.feedback(
        trajectory_id=event.trajectory_id,
        feedback_token=token,
        kind="correction",
        text="Say 2 + 3 = 5.",
        turn=2,
    )
    assert fix.status_code == 202
    thumbs, correction = stream(redis_client, STREAM_FEEDBACK)
    assert (
        isinstance(thumbs, FeedbackEvent)
        and thumbs.value == 1
        and thumbs.user_id == api.stored("u1")
    )
    assert thumbs.credential == credential
    assert thumbs.policy_version == "v4" and thumbs.event_id == up.json()["event_id"]
    assert (correction.kind.value, correction.text, correction.turn) == (
        "correction",
        "Say 2 + 3 = 5.",
        2,
    )


def test_thread_continues_across_requests_and_an_api_restart(start_api, llm):
    llm.push(Reply(content="Hello Ann."), Reply(content="You are Ann."), Reply(content="Ann."))
    first_api = start_api()
    first = first_api.run("I am Ann.").json()
    second = first_api.run("Who am I?", thread_id=first["thread_id"]).json()
    first_api.stop()

    restarted = start_api()  # a new app instance on the same Redis
    third = restarted.run("Again: who am I?", thread_id=first["thread_id"]).json()
    assert first["thread_id"] == second["thread_id"] == third["thread_id"]
    assert [m["content"] for m in llm.requests[2]["messages"][1:]] == [
        "I am Ann.",
        "Hello Ann.",
        "Who am I?",
        "You are Ann.",
        "Again: who am I?",
    ]
    assert third["output"] == "Ann."


def test_reflexion_run_through_the_api(start_api, llm, redis_client):
    llm.push(Reply(content="4"), Reply(content="Use the add tool."), Reply(content="5"))
    body = start_api().run("2+3?", agent="solver").json()
    assert body["output"] == "5" and body["status"] == "ok"
    [event] = stream(redis_client, STREAM_TRAJECTORIES)
    assert event.metadata == {
        "arloop.verdict": "pass",
        "arloop.attempts": "2",
        "arloop.credential": plain_key(API_KEY)["name"],
    }
    assert [s.name for s in event.tool_steps] == ["expect", "expect"]


def test_scrubber_keeps_phi_out_of_redis_but_not_out_of_the_answer(start_api, llm, redis_client):
    llm.push(Reply(content="Rest well, Alice."))
    api = start_api(scrubber=lambda t: t.replace("Alice", "<PERSON>"))
    body = api.run("I am Alice and I have a cough.").json()
    assert body["output"] == "Rest well, Alice."
    [(_, fields)] = redis_client.xrange(STREAM_TRAJECTORIES)
    assert b"Alice" not in fields[b"data"] and b"<PERSON>" in fields[b"data"]
    [event] = stream(redis_client, STREAM_TRAJECTORIES)
    assert event.model_steps[0].prompt_token_ids is None
    assert event.model_steps[0].completion_token_ids is None


def test_metrics_count_runs_and_feedback(start_api, llm):
    llm.push(Reply(content="hi"))
    api = start_api()
    body = api.run("hello").json()
    api.feedback(
        trajectory_id=body["trajectory_id"],
        feedback_token=body["feedback_token"],
        kind="rating",
        value=9,
    )
    text = api.http.get("/metrics").text
    assert 'arloop_runs_total{agent="tutor",status="ok"} 1.0' in text
    assert 'arloop_model_calls_total{agent="tutor",policy_version="fake-v0"} 1.0' in text
    assert 'arloop_feedback_total{kind="rating",outcome="422"} 1.0' in text


def test_serve_reads_the_environment_and_answers(redis_url, llm, tmp_path):
    port = free_port()
    env = {
        **os.environ,
        "ARLOOP_REDIS_URL": redis_url,
        "ARLOOP_AGENTS_PORT": str(free_port()),  # `--port` wins over the variable
        "ARLOOP_PORT": str(free_port()),
        "ARLOOP_POLICY_API_BASE": llm.base_url,
        "ARLOOP_API_KEYS": '["env-key"]',
        "ARLOOP_PACKS": '["tutoring"]',
        "ARLOOP_SCRUB_PHI": "false",
        "ARLOOP_LOG_LEVEL": "WARNING",
    }
    cli = f"from deploy.cli import app; app(['serve', 'agents', '--port', '{port}'])"
    proc = subprocess.Popen([sys.executable, "-c", cli], env=env, cwd=tmp_path)
    try:
        url = f"http://127.0.0.1:{port}"
        for _ in range(600):
            try:
                if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.1)  # not up, or up and not ready yet
        llm.push(Reply(content="Four."))
        reply = httpx.post(
            f"{url}/v1/agents/tutor/runs",
            json={"input": "2+2?", "user_id": "u"},
            headers={"Authorization": "Bearer env-key"},
            timeout=30,
        )
        assert reply.status_code == 200 and reply.json()["output"] == "Four."
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_phi_scrubber_is_on_by_default(start_api, llm, redis_client):
    llm.push(Reply(content="We will email jane.roe@example.org today."))
    api = start_api(scrub_phi=True)
    body = api.run("I'm Jane Roe, call me on 555-123-4567 or jane.roe@example.org").json()
    assert body["output"] == "We will email jane.roe@example.org today."
    [(_, fields)] = redis_client.xrange(STREAM_TRAJECTORIES)
    for raw in (b"555-123-4567", b"jane.roe@example.org"):
        assert raw not in fields[b"data"]
    assert llm.requests[0]["messages"][-1]["content"].endswith("jane.roe@example.org")
