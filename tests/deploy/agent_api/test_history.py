"""Reading history back over HTTP: a thread for its user only, feedback pages, the JSONL export."""

from __future__ import annotations

import json

from tests.fakes.scripted_llm import Reply


def rated_runs(api, llm, n: int, user: str = "u1", agent: str = "tutor") -> list[dict]:
    out = []
    for i in range(n):
        llm.push(Reply(content=f"answer {i}"))
        body = api.run(f"question {i}", user=user, agent=agent).json()
        token = {"trajectory_id": body["trajectory_id"], "feedback_token": body["feedback_token"]}
        assert (
            api.feedback(kind="thumbs", value=1 if i % 2 == 0 else -1, **token).status_code == 202
        )
        out.append(body)
    return out


def test_a_thread_is_shown_to_its_user_only(start_api, llm):
    api = start_api()
    llm.push(Reply(tool_calls=[("add", '{"a": 2, "b": 3}')]), Reply(content="5"))
    thread = api.run("What is 2+3?", user="alice").json()["thread_id"]
    mine = api.http.get(f"/v1/threads/{thread}", params={"user_id": "alice"})
    assert mine.status_code == 200
    view = mine.json()
    assert (view["agent"], view["user_id"]) == ("tutor", "alice")
    assert [m["role"] for m in view["messages"]] == ["user", "assistant", "tool", "assistant"]
    assert view["messages"][1]["tool_calls"][0]["function"]["name"] == "add"
    assert view["messages"][2]["content"] == "5" and view["messages"][3]["content"] == "5"
    theirs = api.http.get(f"/v1/threads/{thread}", params={"user_id": "mallory"})
    missing = api.http.get("/v1/threads/th_nothing", params={"user_id": "alice"})
    assert theirs.status_code == missing.status_code == 404  # no telling which
    assert api.http.get(f"/v1/threads/{thread}").status_code == 422  # user_id is required
    bad = api.http.get("/v1/threads/x%20y", params={"user_id": "alice"})
    assert bad.status_code == 422


def test_feedback_pages_filter_and_continue(start_api, llm):
    api = start_api()
    runs = rated_runs(api, llm, 5)
    page = api.http.get("/v1/feedback", params={"limit": 2}).json()
    assert [i["trajectory_id"] for i in page["items"]] == [r["trajectory_id"] for r in runs[:2]]
    assert all(i["agent"] == "tutor" and i["kind"] == "thumbs" for i in page["items"])
    rest = api.http.get("/v1/feedback", params={"cursor": page["next_cursor"]}).json()
    assert [i["trajectory_id"] for i in rest["items"]] == [r["trajectory_id"] for r in runs[2:]]
    assert rest["next_cursor"] is None
    ups = api.http.get("/v1/feedback", params={"agent": "tutor", "kind": "thumbs"}).json()
    assert len(ups["items"]) == 5 and [i["value"] for i in ups["items"]] == [1, -1, 1, -1, 1]
    assert api.http.get("/v1/feedback", params={"kind": "rating"}).json()["items"] == []
    later = api.http.get("/v1/feedback", params={"since": "4102444800"}).json()  # year 2100
    assert later == {"items": [], "next_cursor": None}
    iso = api.http.get("/v1/feedback", params={"since": "2020-01-01T00:00:00+00:00"}).json()
    assert len(iso["items"]) == 5


def test_bad_feedback_parameters_are_clear_4xx(start_api):
    api = start_api()
    cases = {
        "kind=likes": (422, "kind='likes' is not one of"),
        "since=yesterday": (422, "neither seconds since the epoch nor an ISO 8601"),
        "since=1e99999999": (422, "out of range"),
        "since=nan": (422, "out of range"),
        "cursor=abc": (422, "not a stream entry id"),
        "limit=0": (422, ""),
        "limit=100000": (422, ""),
        "agent=nobody": (404, "unknown agent 'nobody'"),
        "agent=a%20b": (422, ""),
    }
    for query, (status, words) in cases.items():
        answer = api.http.get(f"/v1/feedback?{query}")
        assert answer.status_code == status, (query, answer.text)
        assert words in json.dumps(answer.json()["detail"]), query


def test_export_joins_runs_with_their_feedback_as_json_lines(start_api, llm):
    api = start_api()
    runs = rated_runs(api, llm, 3)
    llm.push(Reply(content="unrated"))
    silent = api.run("no feedback").json()
    export = api.http.get("/v1/feedback/export")
    assert export.status_code == 200
    assert export.headers["content-type"].startswith("application/x-ndjson")
    lines = [json.loads(line) for line in export.text.splitlines()]
    assert [x["trajectory"]["event_id"] for x in lines] == [
        *(r["trajectory_id"] for r in runs),
        silent["trajectory_id"],
    ]
    assert [[f["value"] for f in x["feedback"]] for x in lines] == [[1], [-1], [1], []]
    assert lines[0]["trajectory"]["output"] == "answer 0"
    rated = api.http.get("/v1/feedback/export", params={"rated_only": "true"}).text.splitlines()
    assert len(rated) == 3
    assert api.http.get("/v1/feedback/export", params={"since": "soon"}).status_code == 422
    assert api.http.get("/v1/feedback/export", params={"agent": "solver"}).text == ""


def test_error_answers_are_in_the_openapi_schema(start_api):
    paths = start_api().http.get("/openapi.json").json()["paths"]
    stream = paths["/v1/agents/{agent}/runs/stream"]["post"]["responses"]
    assert {"401", "404", "413", "429", "503"} <= set(stream)
    assert "text/event-stream" in stream["200"]["content"]
    for path, method in [
        ("/v1/agents/{agent}/runs", "post"),
        ("/v1/feedback", "post"),
        ("/v1/feedback", "get"),
        ("/v1/threads/{thread_id}", "get"),
    ]:
        statuses = set(paths[path][method]["responses"])
        assert {"401", "503"} <= statuses, (path, method)
    assert {"413", "429"} <= set(paths["/v1/agents/{agent}/runs"]["post"]["responses"])
