"""Simulated users against the real agent API (real HTTP, real Redis, a scripted model)."""

import asyncio
import json
import random
import re
from dataclasses import replace

import pytest

from agents.events import STREAM_FEEDBACK, STREAM_TRAJECTORIES, decode
from agents.packs import get_pack, load_packs
from deploy.demo.users import (
    PATIENTS,
    AgentClient,
    Behaviour,
    Verdict,
    correction_text,
    feedback_for,
    judge,
    run_traffic,
)
from tests.fakes.api import API_KEY
from tests.fakes.scripted_llm import Reply

EVERYTHING = Behaviour(thumbs=1.0, rating=1.0, outcome=1.0, correction=1.0, noise=0.0, silence=0.0)


@pytest.fixture(scope="module")
def tutoring():
    return get_pack("tutoring")


def student_model(
    wrong: set[str] = frozenset(), no_tool: set[str] = frozenset(), pad: bool = False
):
    """A scripted tutor: the calculator on the problem's numbers (wrong op for `wrong`), then `####`."""
    problems = {t.input: t for t in get_pack("tutoring").tasks("train")[:40]}

    def respond(request) -> Reply:
        messages = request["messages"]
        question = messages[-1]["content"] if messages[-1]["role"] == "user" else None
        if question is not None:
            task = next(t for q, t in problems.items() if _same(q, question))
            if task.id in no_tool:
                return Reply(content=f"The answer is {task.reference}.\n#### {task.reference}")
            a, b = re.findall(r"\d+", task.meta["expression"])
            op = "+" if task.id in wrong and "+" not in task.meta["expression"] else "-"
            expression = task.meta["expression"] if task.id not in wrong else f"{a}{op}{b}"
            return Reply(tool_calls=[("calculator", json.dumps({"expression": expression}))])
        result = messages[-1]["content"]
        filler = " Let me explain every step of this again in great detail." * 8 if pad else ""
        return Reply(content=f"The answer is {result}.{filler}\n#### {result}")

    return respond


def _same(original: str, scrubbed: str) -> bool:
    """The API scrubs names before the model sees the question: compare around them."""
    return re.sub(r"^\w+|\b[A-Z]\w+ have\b", "", original) == re.sub(
        r"^\[NAME\]|\[NAME\] have\b", "", scrubbed
    )


def traffic(api, pack, tasks, behaviour, **kwargs):
    async def go():
        client = AgentClient(api.server.url, API_KEY)
        try:
            return await run_traffic(client, pack, tasks, behaviour, concurrency=4, **kwargs)
        finally:
            await client.aclose()

    return asyncio.run(go())


def stream(redis_client, name):
    return [decode(fields) for _, fields in redis_client.xrange(name)]


def test_students_rate_right_answers_up_and_wrong_ones_down(start_api, llm, tutoring, redis_client):
    tasks = tutoring.tasks("train")[:6]
    llm.responder = student_model(wrong={tasks[1].id, tasks[4].id})
    api = start_api(specs=load_packs(["tutoring"]))
    visits = traffic(api, tutoring, tasks, EVERYTHING)
    assert [v.task.id for v in visits] == [t.id for t in tasks]
    got = {}
    for f in stream(redis_client, STREAM_FEEDBACK):
        got.setdefault(f.trajectory_id, {})[f.kind.value] = (
            f.value if f.value is not None else f.text
        )
    for i, v in enumerate(visits):
        assert v.tools == ["calculator"] and v.policy_version
        if i in (1, 4):
            assert v.verdict.score == 0.0
            assert got[v.trajectory_id] == {
                "thumbs": -1,
                "rating": 1,
                "outcome": 0.0,
                "correction": correction_text(v.task),
            }
        else:
            assert v.verdict.score == 1.0
            assert got[v.trajectory_id] == {"thumbs": 1, "rating": 5, "outcome": 1.0}
    runs = {t.event_id: t for t in stream(redis_client, STREAM_TRAJECTORIES)}
    assert set(runs) == {v.trajectory_id for v in visits}
    assert all(runs[v.trajectory_id].user_id == api.stored(v.user_id) for v in visits)


def test_a_missed_tool_and_padding_each_cost_a_star(start_api, llm, tutoring):
    tasks = tutoring.tasks("train")[:2]
    llm.responder = student_model(no_tool={tasks[0].id}, pad=True)
    api = start_api(specs=load_packs(["tutoring"]))
    plain, padded = traffic(api, tutoring, tasks, EVERYTHING)
    assert plain.tools == [] and plain.verdict.satisfaction == 0.75
    assert padded.verdict.padded and padded.verdict.satisfaction == 0.75
    assert ("thumbs", 1) in plain.feedback and ("rating", 4) in plain.feedback
    assert ("rating", 4) in padded.feedback


def test_silent_users_send_nothing_and_the_rest_send_at_least_a_thumb(
    start_api, llm, tutoring, redis_client
):
    tasks = tutoring.tasks("train")[:6]
    llm.responder = student_model()
    api = start_api(specs=load_packs(["tutoring"]))
    sparse = Behaviour(thumbs=0.0, rating=0.0, outcome=0.0, correction=0.0, noise=0.0)
    visits = traffic(api, tutoring, tasks, sparse, silent={0, 3})
    assert [v.silent for v in visits] == [True, False, False, True, False, False]
    fed = [f.trajectory_id for f in stream(redis_client, STREAM_FEEDBACK)]
    assert sorted(fed) == sorted(v.trajectory_id for v in visits if not v.silent)
    assert all(v.feedback == [("thumbs", 1)] for v in visits if not v.silent)


def test_feedback_waits_for_the_delay(start_api, llm, tutoring, redis_client):
    llm.responder = student_model()
    api = start_api(specs=load_packs(["tutoring"]))
    late = Behaviour(noise=0.0, silence=0.0, delay_s=(0.4, 0.4))
    (visit,) = traffic(api, tutoring, tutoring.tasks("train")[:1], late)
    (run,) = stream(redis_client, STREAM_TRAJECTORIES)
    first = min(f.created_at for f in stream(redis_client, STREAM_FEEDBACK))
    assert first - run.finished_at >= 0.4


def _verdict(score=1.0, used_tool=True, flag=False, padded=False):
    return Verdict(score, used_tool, True, flag, padded)


def test_noise_flips_judgements():
    t = get_pack("tutoring").tasks("train")[0]
    always = Behaviour(rating=0.0, outcome=1.0, correction=0.0, noise=1.0, silence=0.0)
    sent = dict(
        (b["kind"], b["value"]) for b in feedback_for(_verdict(), t, always, random.Random(0))
    )
    assert sent == {"thumbs": -1, "outcome": 0.0}
    rng, noisy = random.Random(1), Behaviour(rating=1.0, noise=0.5, silence=0.0)
    stars = [
        b["value"]
        for _ in range(200)
        for b in feedback_for(_verdict(), t, noisy, rng)
        if b["kind"] == "rating"
    ]
    assert set(stars) == {4, 5} and 0.15 < stars.count(4) / len(stars) < 0.35  # +1 stays at 5


def test_silence_rate_is_respected():
    t = get_pack("tutoring").tasks("train")[0]
    rng, b = random.Random(2), Behaviour(silence=0.3)
    quiet = sum(not feedback_for(_verdict(), t, b, rng) for _ in range(1000))
    assert 250 < quiet < 350


def test_patients_are_unhappy_when_a_red_flag_is_not_escalated():
    medical = get_pack("medical")
    flagged = next(t for t in medical.tasks("train") if t.meta["red_flag"] == "true")
    calm = next(t for t in medical.tasks("train") if t.reference == "self-care")
    missed = judge(medical, flagged, "Rest at home.\nTriage: urgent", ["kb_search"], 60)
    assert missed.red_flag_missed and missed.satisfaction == 0.0
    right = judge(medical, flagged, "Call 999 now.\nTriage: emergency", ["kb_search"], 60)
    assert right.satisfaction == 1.0
    cautious = judge(medical, calm, "Triage: see a doctor", [], 60)
    assert cautious.score == 0.5 and cautious.satisfaction == 0.25  # no kb_search either
    assert correction_text(flagged).endswith("Triage: emergency")


def test_patients_use_the_triage_agent_over_http(start_api, llm, redis_client):
    medical = get_pack("medical")
    tasks = [t for t in medical.tasks("train") if t.reference == "emergency"][:2]

    def respond(request) -> Reply:
        if request["messages"][-1]["role"] == "user":
            return Reply(tool_calls=[("kb_search", '{"query": "chest pain"}')])
        return Reply(
            content="Call emergency services now. This is general information, not "
            "medical advice.\nTriage: emergency"
        )

    llm.responder = respond
    api = start_api(specs=load_packs(["medical"]))
    visits = traffic(api, medical, tasks, EVERYTHING)
    assert all(v.verdict.satisfaction == 1.0 and v.tools == ["kb_search"] for v in visits)
    assert {f.kind.value for f in stream(redis_client, STREAM_FEEDBACK)} == {
        "thumbs",
        "rating",
        "outcome",
    }


def test_patients_feedback_is_a_clinics_the_assigned_disposition_on_a_share_of_visits():
    """A wrong level gets the clinician's outcome 0 and a correction naming the assigned level,
    free of the patients' noise; a right one an outcome 1; about half the visits get one."""
    medical = get_pack("medical")
    t = next(t for t in medical.tasks("train") if t.reference == "urgent")
    rng, b = random.Random(3), replace(PATIENTS, silence=0.0, noise=1.0)
    wrong = [feedback_for(_verdict(score=0.0), t, b, rng) for _ in range(400)]
    judged = [f for f in wrong if any(x["kind"] == "outcome" for x in f)]
    assert 0.4 < len(judged) / len(wrong) < 0.6
    for sent in judged:
        assert {"kind": "outcome", "value": 0.0} in sent
        assert {"kind": "correction", "text": correction_text(t)} in sent
        assert medical.reference_from(correction_text(t)) == "urgent"
    assert not any(x["kind"] == "rating" for f in wrong for x in f)
    right = [feedback_for(_verdict(), t, b, rng) for _ in range(100)]
    assert all(x["value"] == 1.0 for f in right for x in f if x["kind"] == "outcome")
    ask = next(t for t in medical.tasks("train") if t.reference == "ask")
    assert correction_text(ask).endswith("?")  # the question the rules would have asked


def _flaky_api(statuses: list[int]):
    """An agent API that answers each run with the next status (then 200 with a run)."""
    from starlette.applications import Starlette
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    seen: list[int] = []

    async def runs(request):
        seen.append(1)
        status = statuses.pop(0) if statuses else 200
        if status != 200:
            return JSONResponse({"error": "policy_timeout"}, status_code=status)
        return JSONResponse({"trajectory_id": "t1", "output": "ok"})

    return Starlette(routes=[Route("/v1/agents/{agent}/runs", runs, methods=["POST"])]), seen


def test_a_visit_answered_504_is_tried_again_and_then_stops_the_demo_in_one_line(monkeypatch):
    """On a busy machine a policy call can time out: the student asks again after a pause;
    three 5xx in a row end the demo with one line naming the cause, not a traceback."""
    import deploy.demo.users as users
    from deploy.demo.stack import StackError
    from tests.fakes.servers import ServerThread

    monkeypatch.setattr(users, "RETRY_PAUSES_S", (0.01, 0.01))

    async def visit(app):
        with ServerThread(app) as server:
            client = AgentClient(server.url, API_KEY)
            try:
                return await client.run("triage", "hi", "u1")
            finally:
                await client.aclose()

    app, seen = _flaky_api([504, 502])
    assert asyncio.run(visit(app))["trajectory_id"] == "t1" and len(seen) == 3
    app, seen = _flaky_api([504, 504, 503, 504])
    with pytest.raises(StackError, match="answered 503 to a visit 3 times.*too busy"):
        asyncio.run(visit(app))
    assert len(seen) == 3
    app, _ = _flaky_api([422])
    with pytest.raises(Exception, match="422"):  # a client error is not retried
        asyncio.run(visit(app))
