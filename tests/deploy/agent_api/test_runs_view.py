"""The runs view's API over real HTTP and Redis: filters, pages and bounds, one run whole, and
only the scrubbed copy of a run ever shown."""

from __future__ import annotations

from agents.events import AnswerPath
from agents.guard import Reviewed
from agents.runtime import AgentSpec
from deploy.agent_api import run_log
from tests.fakes.api import api_specs
from tests.fakes.scripted_llm import Reply
from tests.fakes.tools import Add

FALLBACK = "I cannot answer that safely; please ask a person."
USER_KEY = "alice-key-" + "a" * 20


def unsure_guard(question: str, answer: str, verdict: str) -> Reviewed:
    """The fallback answers whatever the model says with 'unsure' in it."""
    if "unsure" in answer:
        return Reviewed(FALLBACK, AnswerPath.FALLBACK, {"reason": "unsure"})
    return Reviewed(answer, AnswerPath.MODEL)


def guarded_specs() -> list[AgentSpec]:
    tutor = AgentSpec(
        name="tutor",
        description="adds",
        system_prompt="You add.",
        tools=(Add(),),
        task_kind="tutoring",
        guard=unsure_guard,
    )
    return [tutor, api_specs()[1]]


def keys() -> list:
    alice = {"key": USER_KEY, "name": "alice", "identity": "user", "user": "alice"}
    return ["test-key", alice]


def seed(api, llm) -> dict[str, dict]:
    """Five runs: a tool call (thumbs up), a plain answer (thumbs down), a fallback, a solver
    run, and alice's own run (no feedback)."""
    out = {}
    llm.push(Reply(tool_calls=[("add", '{"a": 2, "b": 3}')]), Reply(content="5"))
    out["tool"] = api.run("What is 2+3?", user="bob").json()
    llm.push(Reply(content="7"))
    out["wrong"] = api.run("What is 3+3?", user="bob").json()
    llm.push(Reply(content="I am unsure"))
    out["fallback"] = api.run("What is 9+9?", user="carol").json()
    llm.push(Reply(content="5"))
    out["solver"] = api.run("2+3?", user="carol", agent="solver").json()
    llm.push(Reply(content="4"))
    out["alice"] = api.run("2+2?", user="alice").json()
    for name, value in (("tool", 1), ("wrong", -1)):
        token = {k: out[name][k] for k in ("trajectory_id", "feedback_token")}
        assert api.feedback(kind="thumbs", value=value, **token).status_code == 202
    return out


def ids(page: dict) -> list[str]:
    return [i["trajectory_id"] for i in page["items"]]


def test_runs_are_listed_newest_first_and_filtered(start_api, llm):
    api = start_api(specs=guarded_specs(), api_keys=keys())
    runs = seed(api, llm)
    get = lambda **q: api.http.get("/v1/runs", params=q).json()  # noqa: E731
    every = get()
    order = ["alice", "solver", "fallback", "wrong", "tool"]
    assert ids(every) == [runs[n]["trajectory_id"] for n in order]
    assert every["next_cursor"] is None and every["partial_feedback"] is False
    tool = every["items"][-1]
    assert (tool["agent"], tool["status"], tool["answered_by"]) == ("tutor", "ok", "model")
    assert tool["tools"] == ["add"] and tool["model_calls"] == 2
    assert tool["feedback"] | {"kinds": None} == {
        "count": 1,
        "thumbs_up": 1,
        "thumbs_down": 0,
        "kinds": None,
        "reviewed": False,
    }
    by = lambda **q: [i["trajectory_id"] for i in get(**q)["items"]]  # noqa: E731
    tid = lambda *names: [runs[n]["trajectory_id"] for n in names]  # noqa: E731
    assert by(agent="solver") == tid("solver")
    assert by(answered_by="fallback") == tid("fallback")
    assert by(status="fallback") == tid("fallback")
    assert by(feedback="thumbs_up") == tid("tool")
    assert by(feedback="thumbs_down") == tid("wrong")
    assert by(feedback="any") == tid("wrong", "tool")
    assert by(feedback="none") == tid("alice", "solver", "fallback")
    version = tool["policy_version"]
    assert by(version=version) == tid(*order) and by(version="v9") == []
    assert by(since="4102444800") == [] and by(until="2020-01-01T00:00:00Z") == []
    assert by(since="2020-01-01T00:00:00Z", until="4102444800") == tid(*order)
    # a key that acts as one user browses that user's runs only
    alice = api.http.get("/v1/runs", headers={"Authorization": f"Bearer {USER_KEY}"}).json()
    assert ids(alice) == tid("alice")


def test_pages_are_bounded_and_continue(start_api, llm, monkeypatch):
    api = start_api(specs=guarded_specs())
    runs = seed(api, llm)
    first = api.http.get("/v1/runs", params={"limit": 2}).json()
    assert len(first["items"]) == 2 and first["next_cursor"] == first["items"][-1]["cursor"]
    rest = api.http.get("/v1/runs", params={"cursor": first["next_cursor"]}).json()
    assert ids(first) + ids(rest) == [
        i["trajectory_id"] for i in api.http.get("/v1/runs").json()["items"]
    ]
    assert rest["next_cursor"] is None
    # a filter that matches little reads a bounded number of runs, then says where to go on
    monkeypatch.setattr(run_log, "RUN_BATCH", 2)
    monkeypatch.setattr(run_log, "RUN_BATCHES", 1)
    found, cursor, calls = [], None, 0
    while True:
        page = api.http.get(
            "/v1/runs", params={"answered_by": "fallback"} | ({"cursor": cursor} if cursor else {})
        ).json()
        calls += 1
        found += ids(page)
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert found == [runs["fallback"]["trajectory_id"]] and calls == 3
    cases = {
        "limit=0": 422,
        "limit=201": 422,
        "status=done": 422,
        "answered_by=someone": 422,
        "feedback=lots": 422,
        "cursor=abc": 422,
        "since=yesterday": 422,
        "agent=nobody": 404,
    }
    for query, status in cases.items():
        assert api.http.get(f"/v1/runs?{query}").status_code == status, query
    for query in ("until=0", "cursor=0-0"):  # before the first entry id: nothing, not a 500
        empty = api.http.get(f"/v1/runs?{query}").json()
        assert empty == {"items": [], "next_cursor": None, "partial_feedback": False}, query
    assert api.http.get("/v1/runs", headers={"Authorization": "Bearer nope"}).status_code == 401


def test_a_run_opens_whole_with_steps_guard_and_feedback(start_api, llm):
    api = start_api(specs=guarded_specs(), api_keys=keys())
    runs = seed(api, llm)
    listed = {i["trajectory_id"]: i for i in api.http.get("/v1/runs").json()["items"]}
    tool_id = runs["tool"]["trajectory_id"]
    run = api.http.get(f"/v1/runs/{tool_id}").json()
    assert run["input"] == "What is 2+3?" and run["output"] == "5"
    assert [s["kind"] for s in run["steps"]] == ["model", "tool", "model"]
    call = run["steps"][0]["tool_calls"][0]
    assert (call["name"], call["arguments"]) == ("add", '{"a": 2, "b": 3}')
    assert run["steps"][1]["name"] == "add" and run["steps"][1]["output"] == "5"
    assert [(f["kind"], f["value"]) for f in run["feedback"]] == [("thumbs", 1.0)]
    assert run["guard"]["answered_by"] == "model"
    cursor = listed[tool_id]["cursor"]
    assert api.http.get(f"/v1/runs/{tool_id}", params={"cursor": cursor}).json() == run
    # the guard's verdict: who answered, the model's own answer, what the guard found
    fallback = api.http.get(f"/v1/runs/{runs['fallback']['trajectory_id']}").json()
    assert fallback["output"] == FALLBACK
    assert fallback["guard"] == {
        "answered_by": "fallback",
        "model_output": "I am unsure",
        "findings": {"reason": "unsure"},
    }
    solver = api.http.get(f"/v1/runs/{runs['solver']['trajectory_id']}").json()
    assert solver["guard"]["findings"] == {"verdict": "pass", "attempts": "1"}
    # not found, or not the caller's: the same 404
    alice = {"Authorization": f"Bearer {USER_KEY}"}
    assert api.http.get(f"/v1/runs/{tool_id}", headers=alice).status_code == 404
    assert api.http.get("/v1/runs/traj_nothing").status_code == 404
    other = listed[runs["wrong"]["trajectory_id"]]["cursor"]
    assert api.http.get(f"/v1/runs/{tool_id}", params={"cursor": other}).status_code == 404


def test_the_runs_view_shows_the_scrubbed_copy_only(start_api, llm):
    api = start_api(scrubber=lambda text: text.replace("Alice Smith", "<PERSON>"))
    llm.push(Reply(content="Hello Alice Smith, 2+3 is 5"))
    body = api.run("I am Alice Smith: 2+3?", user="u1").json()
    token = {k: body[k] for k in ("trajectory_id", "feedback_token")}
    correction = api.feedback(kind="correction", text="Alice Smith: it is 5", **token)
    assert correction.status_code == 202
    listed = api.http.get("/v1/runs").text
    run = api.http.get(f"/v1/runs/{body['trajectory_id']}").text
    assert "Alice Smith" not in listed and "Alice Smith" not in run
    assert "<PERSON>" in listed and "<PERSON>: it is 5" in run
