"""Rows in TRL's formats from logged runs: which runs, which rewards, which pairs, and TRL's own
helpers (`is_conversational`, `apply_chat_template`) accept every row."""

from __future__ import annotations

import pytest
from trl.data_utils import apply_chat_template, is_conversational

from agents.events import AnswerPath, ModelStep, ToolCallRequest, ToolStep, new_id
from learner.policy.tiny_model import build_tokenizer
from learner.trl_rows import conversation, rated_runs, rows
from tests.learner.learner_events import feedback, trajectory

SYSTEM = {"role": "system", "content": "You add."}


def tool_run(answer: str = "It is 42.", *, user: str = "u1", prompt: str = "What is 12+30?"):
    """A ReAct run as the agent logs it: a tool call, its result, the answer."""
    call = ToolCallRequest(id="c1", name="calculator", arguments='{"expression": "12+30"}')
    first = [SYSTEM, {"role": "user", "content": prompt}]
    said = {"role": "assistant", "content": None, "tool_calls": [_wire(call)]}
    steps = [
        _step(0, first, None, [call]),
        ToolStep(index=1, call_id="c1", name="calculator", arguments={}, output="42", latency_ms=1),
        _step(2, [*first, said, {"role": "tool", "tool_call_id": "c1", "content": "42"}], answer),
    ]
    base = trajectory(prompt=prompt, answer=answer, user=user)
    return base.model_copy(update={"steps": steps, "event_id": new_id("traj")})


def _wire(call: ToolCallRequest) -> dict:
    return {"id": call.id, "type": "function", "function": {"name": call.name, "arguments": "{}"}}


def _step(index, messages, output, calls=()) -> ModelStep:
    return ModelStep(
        index=index,
        messages=messages,
        output=output,
        tool_calls=list(calls),
        model="arloop",
        policy_version="v0",
        latency_ms=1.0,
    )


def test_a_tool_run_is_its_first_prompt_and_what_the_run_added():
    prompt, completion = conversation(tool_run())
    assert prompt == [SYSTEM, {"role": "user", "content": "What is 12+30?"}]
    call = '<tool_call>{"name": "calculator", "arguments": {"expression": "12+30"}}</tool_call>'
    assert completion == [
        {"role": "assistant", "content": call},
        {"role": "tool", "content": "42"},
        {"role": "assistant", "content": "It is 42."},
    ]


def test_runs_the_model_did_not_answer_or_nobody_rated_are_left_out():
    envelope = tool_run().model_copy(update={"answered_by": AnswerPath.ENVELOPE})
    correction_only, thumbs = tool_run(), tool_run()
    runs = [
        (envelope, [feedback(envelope.event_id)]),
        (correction_only, [feedback(correction_only.event_id, "correction", None, text="42")]),
        (thumbs, [feedback(thumbs.event_id, "thumbs", -1)]),
        (tool_run(), []),
    ]
    rated = rated_runs(runs, max_user_share=1.0)
    assert [(r.trajectory.event_id, r.reward) for r in rated] == [(thumbs.event_id, -1.0)]


def _rated_mix():
    good, bad, meh = tool_run("It is 42.", user="a"), tool_run("It is 40.", user="b"), tool_run()
    other = tool_run("It is 7.", user="c", prompt="What is 3+4?")
    runs = [
        (good, [feedback(good.event_id, "rating", 5, user="a")]),
        (bad, [feedback(bad.event_id, "thumbs", -1, user="b")]),
        (meh, [feedback(meh.event_id, "rating", 3, user="d")]),  # (3 - 3) / 2 = 0
        (other, [feedback(other.event_id, "thumbs", 1, user="c")]),
    ]
    return rated_runs(runs, max_user_share=1.0), good, bad, meh, other


def test_each_format_keeps_the_runs_it_is_for_with_the_learners_rewards():
    rated, good, bad, meh, other = _rated_mix()
    grpo = rows("trl-grpo", rated)
    assert {r["trajectory_id"]: r["reward"] for r in grpo} == {
        good.event_id: 1.0,
        bad.event_id: -1.0,
        meh.event_id: 0.0,
        other.event_id: 1.0,
    }
    assert {r["trajectory_id"] for r in rows("sft", rated)} == {good.event_id, other.event_id}
    kto = {r["trajectory_id"]: r["label"] for r in rows("kto", rated)}
    assert kto == {good.event_id: True, bad.event_id: False, other.event_id: True}
    (pair,) = rows("dpo", rated)  # 3+4 has no rejected run: no pair
    assert (pair["chosen_id"], pair["rejected_id"], pair["reward_margin"]) == (
        good.event_id,
        bad.event_id,
        2.0,
    )
    assert pair["chosen"][-1]["content"] == "It is 42."
    assert pair["rejected"][-1]["content"] == "It is 40."


def test_one_user_cannot_own_the_exported_rewards():
    runs = [tool_run(user="loud") for _ in range(4)] + [tool_run(user="quiet")]
    rated = rated_runs(
        [(t, [feedback(t.event_id, "thumbs", 1, user=t.user_id)]) for t in runs], 0.2
    )
    by_user = {r.trajectory.user_id: r.reward for r in rated}
    assert by_user["quiet"] == 1.0 and by_user["loud"] == pytest.approx(0.25)  # the cap holds


@pytest.mark.parametrize("fmt", ["trl-grpo", "sft", "kto", "dpo"])
def test_trls_own_helpers_take_every_row(fmt):
    rated, *_ = _rated_mix()
    tokenizer = build_tokenizer()
    out = rows(fmt, rated)
    assert out, fmt
    for row in out:
        assert is_conversational(row)
        text = apply_chat_template(row, tokenizer)  # raises KeyError on a wrong set of columns
        assert text["prompt"].endswith("<|im_start|>assistant\n")
        completion = text.get("completion") or text["chosen"]
        assert completion.rstrip().endswith("<|im_end|>")
