"""Behaviour logprobs of another engine's numerics are recomputed with the learner's weights."""

import math

import pytest
import torch

from learner.behaviour import RELOGGED, relog_behaviour
from learner.episodes import Episode
from learner.logprobs import completion_logprobs
from learner.rounds import run_round
from tests.learner.learner_events import base_model, feedback, tokenizer, trajectory
from tests.learner.learner_fixtures import tiny_round_plan
from tests.learner.test_rounds import BAD, GOOD, PROMPT, _ingest

OFFSET = 0.05  # what a quantised engine's logprobs are off by, per token, in these tests
LLAMA = "llamacpp-q8_0"


def _served(t, engine: str | None, offset: float = OFFSET):
    """The trajectory as if `engine` had logged its logprobs, each `offset` above the truth."""
    steps = [
        s.model_copy(update={"engine": engine, "logprobs": [v + offset for v in s.logprobs]})
        if getattr(s, "logprobs", None) is not None
        else s
        for s in t.steps
    ]
    return t.model_copy(update={"steps": steps})


def _exact(step) -> list[float]:
    return completion_logprobs(
        base_model(), step.prompt_token_ids, step.completion_token_ids, tokenizer().pad_token_id
    ).tolist()


def test_steps_of_another_engine_get_the_learners_logprobs_and_the_gap_is_reported():
    llama = Episode(_served(trajectory(PROMPT, GOOD, logprobs=True, tool_turn=True), LLAMA))
    exact = Episode(_served(trajectory(PROMPT, BAD, logprobs=True), "transformers-fp32"))
    unsaid = Episode(_served(trajectory(PROMPT, BAD, logprobs=True), None))
    f16 = Episode(_served(trajectory(PROMPT, BAD, logprobs=True), "llamacpp-f16"))
    loaded = []

    def load(version):
        loaded.append(version)
        return base_model()

    out, gap = relog_behaviour(
        [llama, exact, unsaid, f16], lambda e, s: True, load, 0, batch_size=1
    )
    assert loaded == ["v0"]  # one load per serving version
    for step in out[0].trajectory.model_steps:
        assert step.engine == RELOGGED
        torch.testing.assert_close(torch.tensor(step.logprobs), torch.tensor(_exact(step)))
    # the learner's numerics, an engine that does not say, unquantised llama.cpp: kept as logged
    assert out[1] is exact and out[2] is unsaid and out[3] is f16
    steps = llama.trajectory.model_steps
    assert (gap.steps, gap.tokens) == (2, sum(len(s.completion_token_ids) for s in steps))
    assert gap.mean == pytest.approx(OFFSET, abs=1e-5)
    assert gap.metrics()["behaviour/engine_gap"] == pytest.approx(OFFSET, abs=1e-5)


def test_only_trained_steps_are_recomputed_and_an_unloadable_version_keeps_its_log():
    llama = Episode(_served(trajectory(PROMPT, GOOD, logprobs=True, tool_turn=True), LLAMA))
    first_only = lambda e, s: s.index == 0  # noqa: E731
    out, gap = relog_behaviour([llama], first_only, lambda v: base_model(), 0)
    relogged, later = out[0].trajectory.model_steps
    assert relogged.engine == RELOGGED and later.engine == LLAMA
    assert later.logprobs == llama.trajectory.model_steps[1].logprobs
    assert gap.steps == 1
    out, gap = relog_behaviour([llama], lambda e, s: True, lambda v: None, 0)
    assert out[0] is llama and (gap.steps, gap.kept) == (0, 2) and math.isnan(gap.mean)


@pytest.mark.parametrize("recompute", [True, False])
def test_a_round_on_llama_served_runs_weights_them_as_the_learner_sees_them(
    redis_client, store, registry, tmp_path, recompute
):
    events = []
    for i in range(4):
        t = _served(trajectory(PROMPT, GOOD if i % 2 else BAD, user=f"u{i}", logprobs=True), LLAMA)
        events += [t, feedback(t.event_id, "thumbs", 1 if i % 2 else -1, user=f"u{i}")]
    _ingest(redis_client, store, events)
    plan = tiny_round_plan(tmp_path, recompute_behaviour=recompute)
    metrics = run_round(store, registry, plan).metrics
    if recompute:
        assert metrics["behaviour/engine_gap"] == pytest.approx(OFFSET, abs=1e-5)
        assert metrics["behaviour/recomputed_steps"] == 4
        # served by v0, trained from v0: nothing is stale, the importance weight is 1 up to
        # fp32 rounding (the relog and the update batch the steps differently: measured up to
        # 5e-5 apart), far from the offset's exp(-OFFSET)
        assert metrics["is_weight_mean"] == pytest.approx(1.0, abs=2e-4)
    else:
        assert "behaviour/engine_gap" not in metrics
        # the quantisation offset alone would have down-weighted every token
        assert metrics["is_weight_mean"] == pytest.approx(math.exp(-OFFSET), abs=1e-4)
