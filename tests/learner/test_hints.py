"""Hinted runs in the verified sub-rounds: a group that all failed learns from a run that saw
its label, only where the answer then came from a tool and not from the hint."""

from __future__ import annotations

import warnings

import pytest

from agents.events import ModelStep
from learner.config import RoundConfig
from learner.episodes import Episode
from learner.labels import Grounding, find_labels
from learner.logprobs import completion_logprobs
from learner.policy.chat_format import HERMES, prompt_token_ids
from learner.policy.models import load_base
from learner.resample import HINT, Replay, Start, Turn, derived, hint_prompt_ids, hinted, replay
from learner.subrounds import Sampling, plan_replays, run_subrounds
from learner.train_step import PolicyTrainer, TrainConfig
from tests.deploy.policy_server.support import train_to_say
from tests.learner.learner_events import feedback, trajectory
from tests.model_cache import MODEL_CACHE
from tools.calculator import Calculator
from tools.verifiers import final_number, mentioned_number

warnings.filterwarnings("ignore", category=FutureWarning)  # peft's deprecated question

CALC = Calculator()
SPECS = [CALC.spec()]
ASK = [{"role": "user", "content": "What is 12 plus 30?"}]
HINTED = [{"role": "user", "content": "What is 12 plus 30?\n\n" + HINT.format(answer="42")}]
TUTOR = Grounding(final_number, mentioned_number, (CALC,), max_steps=2, tool_format=HERMES)


def _call(expression: str) -> str:
    return f'<tool_call>{{"name": "calculator", "arguments": {{"expression": "{expression}"}}}}</tool_call>'


def _after(messages, expression: str, output: str, call_id: str = "call_0_0_0") -> list[dict]:
    call = {
        "id": call_id,
        "type": "function",
        "function": {"name": "calculator", "arguments": f'{{"expression": "{expression}"}}'},
    }
    return messages + [
        {"role": "assistant", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": call_id, "content": output},
    ]


def _ids(tok, messages) -> list[int]:
    return prompt_token_ids(tok, messages, SPECS, HERMES)


def _model(hinted_says: str):
    """The tiny model, greedy: without the hint it calls 12+20 (and answers 32); with it, it
    writes `hinted_says`, then answers what the calculator returned."""
    model, tok = load_base("tiny", cache_dir=MODEL_CACHE)
    pairs = [
        (_ids(tok, ASK), _call("12+20")),
        (_ids(tok, _after(ASK, "12+20", "32")), "#### 32"),
        (_ids(tok, _after(ASK, "12+20", "32", "call_1_0_0")), "#### 32"),
        (_ids(tok, HINTED), hinted_says),
        (_ids(tok, _after(HINTED, "12+30", "42")), "It is 42. #### 42"),
        (_ids(tok, _after(HINTED, "42", "42")), "#### 42"),
    ]
    train_to_say(model, tok, pairs, steps=300)
    return model, tok


def _served(tok) -> list[Episode]:
    """One run of the question, answered 32, and the user's correction: 42."""
    step = ModelStep(
        index=0,
        messages=ASK,
        tool_names=["calculator"],
        output=_call("12+20"),
        model="arloop",
        policy_version="v0",
        prompt_token_ids=_ids(tok, ASK),
        completion_token_ids=tok(_call("12+20"), add_special_tokens=False)["input_ids"],
        latency_ms=1.0,
    )
    t = trajectory(ASK[0]["content"], "#### 32").model_copy(update={"steps": [step]})
    return [Episode(t, (feedback(t.event_id, "correction", None, text="#### 42"),))]


def _sub_rounds(model, tok, hint_n: int):
    episodes = _served(tok)
    labels = find_labels(episodes, {"tutor": TUTOR}, max_user_share=1.0)
    config = RoundConfig(subrounds=2, resample_n=2, hint_n=hint_n, train_after_tool=False)
    replays = plan_replays(episodes, labels, {"tutor": TUTOR}, config, tok)
    assert len(replays.starts) == 1  # the correction labelled the question: it is replayed
    train = TrainConfig(learning_rate=2e-2, lora_rank=8, lora_alpha=16, kl_coef=0.0)
    trainer = PolicyTrainer(model, tok.pad_token_id, train)
    result = run_subrounds(
        trainer,
        tok,
        episodes,
        replays,
        config,
        Sampling(temperature=0.0, max_tokens=40),
        seed=0,
        current_version=0,
        check_stop=lambda: None,
    )
    return trainer, result


def _preference(model, tok) -> float:
    """How much likelier, without the hint, the model's call of 12+30 is than of 12+20 (nats)."""
    logp = {}
    for expression in ("12+30", "12+20"):
        ids = tok(_call(expression), add_special_tokens=False)["input_ids"]
        logp[expression] = completion_logprobs(model, _ids(tok, ASK), ids, tok.pad_token_id).sum()
    return float(logp["12+30"] - logp["12+20"])


def test_a_hinted_run_samples_with_the_label_and_records_the_prompt_without_it():
    model, tok = _model(_call("12+30"))
    start = Start(_served(tok)[0].trajectory.model_steps[0], TUTOR, "42", key="k")
    [[plain]] = replay(model, tok, [start], n=1, temperature=0.0, max_tokens=40, seed=0)
    assert not plain.solved  # without the hint: 12+20, 32
    [[run]] = replay(model, tok, [hinted(start)], n=1, temperature=0.0, max_tokens=40, seed=0)
    assert run.solved and run.used_tool and derived(run, "42")
    assert run.turns[0].prompt_ids == _ids(tok, ASK)  # trained without the hint
    assert run.turns[1].prompt_ids == _ids(tok, _after(ASK, "12+30", "42"))
    assert run.turns[0].tool_output == "42"


def test_a_group_that_all_failed_learns_from_a_hinted_run_the_tool_answered():
    model, tok = _model(_call("12+30"))
    before = _preference(model, tok)
    trainer, result = _sub_rounds(model, tok, hint_n=1)
    m = result.metrics
    assert m["subround/solved_first"] == 0.0  # unhinted, greedy: never right
    assert m["subround/hinted"] >= 1 and m["subround/hinted_kept"] >= 1, m
    assert m["reward_sources/verified"] == 2 * 2 + m["subround/hinted"]
    assert result.updates
    assert _preference(trainer.model, tok) > before + 1.0  # the right call, without the hint


def test_without_hints_a_group_that_all_failed_teaches_nothing():
    model, tok = _model(_call("12+30"))
    _, result = _sub_rounds(model, tok, hint_n=0)
    assert result.metrics["subround/hinted"] == 0 and result.updates == []


def test_a_hinted_run_that_copied_the_answer_does_not_count():
    """With the hint the model calls the calculator on `42` itself: solved, and the answer
    came from the hint, so nothing is trained."""
    model, tok = _model(_call("42"))
    _, result = _sub_rounds(model, tok, hint_n=1)
    m = result.metrics
    assert m["subround/hinted"] >= 1 and m["subround/hinted_kept"] == 0, m
    assert result.updates == []


def _run(*turns: tuple[str, str]) -> Replay:
    return Replay([Turn([1], [2], [0.0], text, i > 0, out) for i, (text, out) in enumerate(turns)])


@pytest.mark.parametrize(
    "turns, answer, came_from_a_tool",
    [
        ((("CALL 12+30", "42"), ("#### 42", "")), "42", True),
        ((("CALL 12+30", "42.0"), ("#### 42", "")), "42", True),
        ((("CALL 40+2", "42"), ("#### 42", "")), "42", True),
        ((("CALL 42", "42"), ("#### 42", "")), "42", False),  # the model wrote it first
        ((("#### 42", ""),), "42", False),  # no tool at all
        ((("CALL 12+30", "420"), ("#### 42", "")), "42", False),  # the tool said 420
        ((("CALL 12+30", "4.2"), ("#### 42", "")), "42", False),
        ((("CALL 12+30", "42.5"), ("#### 42", "")), "42", False),
        (
            (("look up chest pain", "Emergency: call 911"), ("Triage: emergency", "")),
            "emergency",
            True,
        ),
    ],
)
def test_an_answer_came_from_a_tool_only_when_a_tool_stated_it_before_the_model(
    turns, answer, came_from_a_tool
):
    assert derived(_run(*turns), answer) is came_from_a_tool


def test_no_hint_for_an_agent_without_tools_or_a_message_that_is_not_text():
    model, tok = load_base("tiny", cache_dir=MODEL_CACHE)
    step = _served(tok)[0].trajectory.model_steps[0]
    bare = Grounding(final_number, mentioned_number, (), tool_format=HERMES)
    assert hinted(Start(step, bare, "42", key="k")) is None
    parts = step.model_copy(update={"messages": [{"role": "user", "content": [{"type": "text"}]}]})
    assert hinted(Start(parts, TUTOR, "42", key="k")) is None
    shown = hinted(Start(step, TUTOR, "42", key="k"))
    assert shown.hint == HINT.format(answer="42")
    assert hint_prompt_ids(shown, tok) == _ids(tok, HINTED)  # what a self-teacher is scored on
