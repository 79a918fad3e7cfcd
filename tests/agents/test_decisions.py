"""A version's decision head puts its label into the model's reply, and nothing it says gets
past the pack's guard: the triage agent on the scripted endpoint, real graph and Redis."""

from __future__ import annotations

import pytest

from agents.events import CASE_KEY, AnswerPath
from tests.agents.test_triage_envelope import GOOD, HEART, SORE, assert_safe, runtime, says
from tests.agents.test_triage_rules import FLOORS
from tests.fakes.scripted_llm import Reply
from tools.verifiers import LEVELS, triage_level


def _sore_throat_run(llm) -> None:
    llm.push(Reply(tool_calls=[("kb_search", '{"query": "sore throat"}')]), Reply(content=GOOD))


async def test_the_heads_level_replaces_the_models_and_the_run_records_both(aredis, llm):
    llm.heads["level"] = lambda request: "see a doctor"
    _sore_throat_run(llm)
    event = await runtime(aredis, llm).run("triage", SORE, "u1")

    assert triage_level(GOOD) == "self-care"  # what the model wrote
    assert triage_level(event.output) == "see a doctor", event.output
    assert (
        event.answered_by is AnswerPath.MODEL and triage_level(event.model_answer) == "see a doctor"
    )
    assert event.output.split("Triage:")[0] == GOOD.split("Triage:")[0]  # its words kept
    assert event.metadata["arloop.decision.level"] == "see a doctor"
    assert event.metadata["arloop.decision.level.model_said"] == "self-care"
    asked = llm.head_requests[-1]
    assert asked["input"] == SORE and asked["model"] == llm.requests[-1]["model"]
    assert [s.output for s in event.model_steps][-1] == GOOD  # the step keeps the model's words


async def test_without_a_fitted_head_the_models_reply_stands(aredis, llm):
    _sore_throat_run(llm)  # no head: the endpoint answers 404
    event = await runtime(aredis, llm).run("triage", SORE, "u1")

    assert event.output == GOOD and len(llm.head_requests) == 1
    assert not any(k.startswith("arloop.decision") for k in event.metadata)


@pytest.mark.parametrize(
    "label",
    ["banana", "", "Triage: emergency", {"label": "urgent"}, {"probability": 1}, [1, 2], 7],
)
async def test_a_label_the_decision_does_not_know_is_ignored(aredis, llm, label):
    llm.heads["level"] = lambda request: label
    _sore_throat_run(llm)
    event = await runtime(aredis, llm).run("triage", SORE, "u1")

    assert event.output == GOOD


@pytest.mark.parametrize("head_level", ["self-care", "see a doctor", "urgent"])
async def test_a_head_cannot_lower_a_red_flag(aredis, llm, head_level):
    llm.heads["level"] = lambda request: head_level
    llm.responder = says(f"Rest at home. {GOOD}")
    event = await runtime(aredis, llm).run("triage", HEART, "u1")

    assert triage_level(event.output) == "emergency", event.output
    assert event.answered_by is not AnswerPath.MODEL
    assert_safe(HEART, event.output)


async def test_a_heads_emergency_stands_only_on_a_red_flag(aredis, llm):
    """Unflagged, a head's `emergency` becomes `urgent` (a head's word alone is not a
    discriminator); on a red-flag message it stands, as the envelope's does."""
    llm.heads["level"] = lambda request: "emergency"
    _sore_throat_run(llm)
    event = await runtime(aredis, llm).run("triage", SORE, "u1")

    assert triage_level(event.output) == "urgent", event.output
    assert event.answered_by is AnswerPath.MODEL
    assert event.metadata["arloop.decision.level"] == "emergency"  # what the head said
    assert event.metadata["arloop.decision.level.applied"] == "urgent"  # what the reply took

    llm.responder = says(GOOD)
    flagged = await runtime(aredis, llm).run("triage", HEART, "u2")
    assert triage_level(flagged.output) == "emergency", flagged.output
    assert "arloop.decision.level.applied" not in flagged.metadata


async def test_a_failing_head_endpoint_leaves_the_reply_and_the_run_ok(aredis, llm):
    def broken(request):
        raise RuntimeError("head crashed")  # the fake answers 500

    llm.heads["level"] = broken
    _sore_throat_run(llm)
    event = await runtime(aredis, llm).run("triage", SORE, "u1")

    assert event.output == GOOD


async def test_an_agent_with_a_decision_streams_no_model_text_the_head_may_change(aredis, llm):
    """As with a guard: a listener hears tool steps and the end, never the model's own level."""
    from dataclasses import replace

    from agents.packs.medical import triage
    from agents.run_context import RunUpdate

    llm.heads["level"] = lambda request: "urgent"
    _sore_throat_run(llm)
    heard: list[RunUpdate] = []
    agent = replace(triage(), input_filter=None, guard=None)  # the decision alone
    event = await runtime(aredis, llm, agent).run("triage", SORE, "u1", emit=heard.append)

    assert triage_level(event.output) == "urgent"
    assert heard and all(u.kind not in ("delta", "model") for u in heard)


async def test_a_retry_asks_the_head_about_the_patients_message_not_the_retry_note(aredis, llm):
    """A Reflexion retry's last human message is its instructions ("did not pass the check");
    the head must read the case itself on every attempt."""
    from tests.agents.test_triage_envelope import HOSTILE

    llm.heads["level"] = lambda request: "see a doctor"
    llm.push(
        Reply(tool_calls=[("kb_search", '{"query": "sore throat"}')]),
        Reply(content=HOSTILE["dose"]),  # fails its checks: a reflection, then a retry
    )
    llm.responder = says(GOOD)
    await runtime(aredis, llm).run("triage", SORE, "u1")

    assert len(llm.head_requests) >= 2, "precondition: the run retried"
    assert {r["input"] for r in llm.head_requests} == {SORE}


async def test_a_reply_that_asks_is_not_sent_to_the_head(aredis, llm):
    """A follow-up question takes no level: the head is not asked (a call saved per turn)."""
    llm.heads["level"] = lambda request: "see a doctor"
    llm.responder = lambda request: Reply(content="How old is your baby?")
    event = await runtime(aredis, llm).run("triage", "my baby has a fever", "u1")
    assert event.output == "How old is your baby?", "precondition: the model asked"
    assert llm.head_requests == [] and "arloop.decision.level" not in event.metadata


async def test_a_reply_to_a_follow_up_question_is_decided_and_recorded_with_its_case(aredis, llm):
    """The reply ("3 weeks") is not the case: the head reads the message it answers joined to
    it, and the trajectory keeps that case (`TrajectoryEvent.case`), which the learner fits
    the head on; a new message on the same thread is a case of its own."""
    llm.heads["level"] = lambda request: "see a doctor"
    llm.responder = says(GOOD)
    rt = runtime(aredis, llm)
    first = await rt.run("triage", "my baby has a fever", "u1")
    assert first.metadata.get("arloop.asked") == "age", "precondition: the rules asked"
    second = await rt.run("triage", "3 weeks", "u1", thread_id=first.thread_id)
    assert second.input == "3 weeks" and second.case.startswith("my baby has a fever\n")
    assert second.case.endswith("3 weeks") and second.metadata[CASE_KEY] == second.case
    assert llm.head_requests[-1]["input"] == second.case
    third = await rt.run("triage", SORE, "u1", thread_id=first.thread_id)
    assert CASE_KEY not in third.metadata and third.case == SORE
    assert CASE_KEY not in first.metadata


@pytest.mark.parametrize("message", sorted(FLOORS))
@pytest.mark.parametrize("model", ["garbage", "dose", "empty", "self-care"])
async def test_a_head_saying_self_care_under_a_floor_never_reaches_the_patient(
    aredis, llm, message, model
):
    """A hostile head (always `self-care`) over a hostile model: the floor the message's risk
    factors set still holds, and what is returned passes every check of the pack."""
    from tests.agents.test_triage_envelope import HOSTILE, IGNORES_RED_FLAG

    llm.heads["level"] = lambda request: "self-care"
    llm.responder = says(IGNORES_RED_FLAG if model == "self-care" else HOSTILE[model])
    event = await runtime(aredis, llm).run("triage", message, "u1")

    assert llm.head_requests, "precondition: the hostile head was asked"
    level = triage_level(event.output)
    assert level is not None and LEVELS.index(level) >= LEVELS.index(FLOORS[message]), event.output
    assert_safe(message, event.output)
