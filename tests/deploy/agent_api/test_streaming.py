"""`POST /v1/agents/{agent}/runs/stream` with a plain HTTP client: event order, what the final
event carries, cancel on disconnect (the partial run still logged), the error event."""

from __future__ import annotations

import json
import time

import httpx

from agents.events import STREAM_TRAJECTORIES, RunStatus, decode
from tests.fakes.scripted_llm import Reply


def read_events(
    response: httpx.Response, stop_after: str | None = None
) -> list[tuple[str, object]]:
    """(event, data) pairs of an SSE body; stops early after the first `stop_after` event."""
    events, name = [], None
    for line in response.iter_lines():
        if line.startswith("event: "):
            name = line[len("event: ") :]
        elif line.startswith("data: "):
            events.append((name, json.loads(line[len("data: ") :])))
            if name == stop_after:
                break
    return events


def stream_run(api, text: str, **extra) -> list[tuple[str, object]]:
    body = {"input": text, "user_id": "u1", **extra}
    with api.http.stream("POST", "/v1/agents/tutor/runs/stream", json=body) as response:
        assert response.status_code == 200, response.read()
        assert response.headers["content-type"].startswith("text/event-stream")
        return read_events(response)


def trajectories(redis_client) -> list:
    return [decode(fields) for _, fields in redis_client.xrange(STREAM_TRAJECTORIES)]


def test_events_come_in_order_and_end_with_the_feedback_token(start_api, llm, redis_client):
    llm.fingerprints = {"arloop@champion": "v2"}
    llm.push(Reply(tool_calls=[("add", '{"a": 2, "b": 3}')]), Reply(content="The sum is 5"))
    api = start_api()
    events = stream_run(api, "What is 2+3?")
    # the tool call, its result, the answer's tokens as they came (one chunk each), the answer
    assert [n for n, _ in events] == [
        "metadata",
        "messages/complete",
        "messages/complete",
        *["messages/partial"] * 7,
        "messages/complete",
        "end",
    ]
    meta, end = events[0][1], events[-1][1]
    call, result = events[1][1][0], events[2][1][0]
    assert (call["type"], call["tool_calls"][0]["name"], call["policy_version"]) == (
        "ai",
        "add",
        "v2",
    )
    assert (result["type"], result["name"], result["content"], result["status"]) == (
        "tool",
        "add",
        "5",
        "success",
    )
    partials = [d[0]["content"] for n, d in events if n == "messages/partial"]
    assert partials == [
        "The",
        "The ",
        "The sum",
        "The sum ",
        "The sum is",
        "The sum is ",
        "The sum is 5",
    ]
    assert events[-2][1][0]["content"] == "The sum is 5"
    assert end["trajectory_id"] == meta["run_id"] and end["thread_id"] == meta["thread_id"]
    assert (end["output"], end["status"], end["policy_version"], end["tools"]) == (
        "The sum is 5",
        "ok",
        "v2",
        ["add"],
    )
    # the run is logged as a plain run would be: token ids and logprobs from the chunks
    [logged] = trajectories(redis_client)
    assert logged.trajectory_id == end["trajectory_id"] and logged.status is RunStatus.OK
    assert [s.completion_token_ids for s in logged.model_steps] == [
        r["choices"][0]["token_ids"] for r in llm.responses
    ]
    assert [s.prompt_token_ids for s in logged.model_steps] == [
        r["prompt_token_ids"] for r in llm.responses
    ]
    assert all(len(s.logprobs) == len(s.completion_token_ids) for s in logged.model_steps)
    assert all(r["stream"] is True for r in llm.requests)
    thumbs = {"trajectory_id": end["trajectory_id"], "feedback_token": end["feedback_token"]}
    assert api.feedback(kind="thumbs", value=1, **thumbs).status_code == 202


def test_a_client_that_leaves_cancels_the_run_and_the_partial_run_is_logged(
    start_api, llm, redis_client
):
    words = " ".join(f"w{i}" for i in range(60))
    llm.push(Reply(content=words, chunk_delay_s=0.1))  # ~12 s if it ran to the end
    api = start_api()
    body = {"input": "Talk slowly.", "user_id": "u1"}
    with api.http.stream("POST", "/v1/agents/tutor/runs/stream", json=body) as response:
        events = read_events(response, stop_after="messages/partial")
    assert [n for n, _ in events] == ["metadata", "messages/partial"]
    run_id, thread_id = events[0][1]["run_id"], events[0][1]["thread_id"]
    deadline = time.monotonic() + 10
    while not trajectories(redis_client) and time.monotonic() < deadline:
        time.sleep(0.05)
    [logged] = trajectories(redis_client)
    assert (logged.trajectory_id, logged.status, logged.thread_id) == (
        run_id,
        RunStatus.CANCELLED,
        thread_id,
    )
    assert logged.model_steps == [] and logged.output == ""  # the model call never finished
    # the thread is free again and kept nothing of the cancelled run
    thread = api.http.get(f"/v1/threads/{thread_id}", params={"user_id": "u1"})
    assert thread.status_code == 200 and thread.json()["messages"] == []
    llm.push(Reply(content="fine"))
    again = api.run("Again?", thread_id=thread_id)
    assert again.status_code == 200 and again.json()["output"] == "fine"
    messages = api.http.get(f"/v1/threads/{thread_id}", params={"user_id": "u1"}).json()
    assert [(m["role"], m["content"]) for m in messages["messages"]] == [
        ("user", "Again?"),
        ("assistant", "fine"),
    ]
    metrics = api.http.get("/metrics").text
    assert 'arloop_run_streams_total{outcome="cancelled"} 1.0' in metrics


def test_a_model_fault_is_an_error_event(start_api, llm, redis_client):
    api = start_api()
    llm.push(Reply(status=500))
    events = stream_run(api, "Hi")
    assert [n for n, _ in events] == ["metadata", "error"]
    assert events[1][1]["status"] == 502 and "policy endpoint failed" in events[1][1]["message"]
    llm.push(Reply(content="one two three four five", break_after=2))  # breaks mid-answer
    events = stream_run(api, "Hi again")
    names = [n for n, _ in events]
    assert names[0] == "metadata" and names[-1] == "error" and "end" not in names
    assert "messages/partial" in names and events[-1][1]["status"] == 502
    assert trajectories(redis_client) == []  # a failed run is not logged, streamed or not
    metrics = api.http.get("/metrics").text
    assert 'arloop_run_streams_total{outcome="error"} 2.0' in metrics


def test_errors_before_the_run_are_plain_http_errors(start_api, llm):
    api = start_api()
    url = "/v1/agents/{}/runs/stream"
    unknown = api.http.post(url.format("nobody"), json={"input": "x", "user_id": "u1"})
    assert unknown.status_code == 404 and "tutor" in unknown.json()["detail"]
    llm.push(Reply(content="mine"))
    thread = api.run("Hello", user="alice").json()["thread_id"]
    theirs = {"input": "x", "user_id": "mallory", "thread_id": thread}
    stolen = api.http.post(url.format("tutor"), json=theirs)
    assert stolen.status_code == 403 and "another user" in stolen.json()["detail"]
    long = api.http.post(url.format("tutor"), json={"input": "x" * 9000, "user_id": "u1"})
    assert long.status_code == 413
    assert api.http.post(url.format("tutor"), json={"input": "x"}).status_code == 422
    anonymous = httpx.post(
        api.server.url + url.format("tutor"), json={"input": "x", "user_id": "u"}
    )
    assert anonymous.status_code == 401
