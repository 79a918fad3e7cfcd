"""Verified sub-rounds on the tiny model: labelled prompts resampled, checked, learned from."""

from __future__ import annotations

import warnings

import pytest
import torch

from learner.config import RoundConfig
from learner.episodes import Episode
from learner.labels import Grounding, find_labels
from learner.logprobs import completion_logprobs, make_batch, selected_logprobs
from learner.policy.chat_format import HERMES
from learner.policy.models import load_base
from learner.subrounds import Sampling, plan_replays, run_subrounds
from learner.train_step import PolicyTrainer, TrainConfig
from tests.learner.learner_events import completion_ids, feedback, prompt_ids, trajectory
from tests.model_cache import MODEL_CACHE
from tools.verifiers import final_number, mentioned_number

warnings.filterwarnings("ignore", category=FutureWarning)  # peft's deprecated question

QUESTIONS = ["What is 12 plus 30?", "What is 40 plus 2?"]
RIGHT, WRONG = "#### 42", "#### 40"
TUTOR = {"tutor": Grounding(final_number, mentioned_number, (), max_steps=1, tool_format=HERMES)}
CONFIG = RoundConfig(subrounds=4, resample_n=8, batch_size=16)


def _taught(answers: list[str]):
    """The tiny model fitted (all weights, cross-entropy) to answer each question with
    `answers` in those proportions."""
    model, tok = load_base("tiny", cache_dir=MODEL_CACHE)
    pairs = [(prompt_ids(q), completion_ids(a)) for q in QUESTIONS for a in answers]
    batch = make_batch([p for p, _ in pairs], [c for _, c in pairs], tok.pad_token_id)
    optim = torch.optim.Adam(model.parameters(), lr=1e-2)
    model.train()
    for _ in range(150):
        logp, _ = selected_logprobs(model, batch)  # (N,)
        loss = -logp.mean()
        optim.zero_grad()
        loss.backward()
        optim.step()
    return model.eval().requires_grad_(False), tok


def _mixed_model():
    """Right 3 times in 8, wrong otherwise: the band RL can amplify."""
    return _taught([RIGHT] * 3 + [WRONG] * 5)


def _served(users: int = 4) -> list[Episode]:
    """Served runs: right answers thumbed up, wrong ones down (the labels' evidence)."""
    out = []
    for q in QUESTIONS:
        for i in range(users):
            t = trajectory(q, RIGHT if i % 2 else WRONG, user=f"{q[-4:]}{i}", logprobs=True)
            out.append(Episode(t, (feedback(t.event_id, "thumbs", 1 if i % 2 else -1),)))
    return out


def _p_right(model, q: str) -> float:
    return float(completion_logprobs(model, prompt_ids(q), completion_ids(RIGHT), 0).sum().exp())


def _run(trainer, tok, episodes, config, *, temperature=1.0, judge=None):
    """(labels, result): the episodes' labels found and planned, then `config`'s sub-rounds on
    them from `trainer`."""
    labels = find_labels(episodes, TUTOR, max_user_share=1.0)
    replays = plan_replays(episodes, labels, TUTOR, CONFIG, tok)
    result = run_subrounds(
        trainer,
        tok,
        episodes,
        replays,
        config,
        Sampling(temperature=temperature, max_tokens=8),
        seed=0,
        current_version=0,
        check_stop=lambda: None,
        judge=judge,
    )
    return labels, result


@pytest.fixture(scope="module")
def outcome():
    model, tok = _mixed_model()
    before = [_p_right(model, q) for q in QUESTIONS]
    train = TrainConfig(learning_rate=2e-2, lora_rank=8, lora_alpha=16, kl_coef=0.0)
    trainer = PolicyTrainer(model, tok.pad_token_id, train)
    labels, result = _run(trainer, tok, _served(), CONFIG)
    return before, [_p_right(trainer.model, q) for q in QUESTIONS], labels, result


def test_the_labels_and_the_starting_rate_are_what_the_world_says(outcome):
    before, _, labels, result = outcome
    assert sorted(lb.answer for lb in labels.values()) == ["42", "42"]
    assert result.metrics["labels/replayed"] == 2
    assert all(0.2 < p < 0.6 for p in before), before  # the band RL can amplify
    assert 0.1 < result.metrics["subround/solved_first"] < 0.7


def test_the_verified_reward_rises_across_sub_rounds(outcome):
    before, after, _, result = outcome
    m = result.metrics
    assert m["subround/solved_last"] > m["subround/solved_first"] + 0.2, m
    assert all(a > b + 0.2 for a, b in zip(after, before, strict=True)), (before, after)


def test_every_source_of_reward_is_counted(outcome):
    _, _, _, result = outcome
    m = result.metrics
    assert m["reward_sources/verified"] == CONFIG.subrounds * 2 * CONFIG.resample_n
    assert m["reward_sources/label_served"] == 8  # the served runs joined their groups once
    assert result.used == set(range(8)) and result.updates  # every served run counts as used


def test_a_round_whose_groups_all_tie_makes_no_update():
    model, tok = _taught([RIGHT])
    episodes = [e for e in _served() if e.trajectory.output == RIGHT]
    trainer = PolicyTrainer(model, tok.pad_token_id, TrainConfig(kl_coef=0.0))
    config = RoundConfig(subrounds=1, resample_n=4)
    _, result = _run(trainer, tok, episodes, config, temperature=0.0)
    assert result.metrics["subround/solved_first"] == 1.0
    assert result.updates == []  # every run right: no advantage, no step


@pytest.mark.parametrize("lies, disagreement", [(False, 0.0), (True, 1.0)])
def test_the_reward_model_is_checked_against_the_verifier_before_any_update(lies, disagreement):
    model, tok = _mixed_model()
    trainer = PolicyTrainer(model, tok.pad_token_id, TrainConfig(kl_coef=0.0))
    right = completion_ids(RIGHT)
    seen: list[int] = []

    def judge(prompts, completions):  # a scripted reward model: right or exactly wrong
        seen.append(len(trainer_steps))
        return [(1.0 if c == right else -1.0) * (-1 if lies else 1) for c in completions]

    trainer_steps: list = []
    step = trainer.step
    trainer.step = lambda *a, **k: trainer_steps.append(1) or step(*a, **k)
    _, result = _run(trainer, tok, _served(), RoundConfig(subrounds=2, resample_n=4), judge=judge)
    assert seen == [0]  # once, on the first sub-round's runs, before its updates
    assert len(result.judged) == 2 * 4
    assert result.metrics["reward_model/verifier_disagreement"] == disagreement
    assert trainer_steps  # the sub-rounds still trained


def test_the_resampling_decodes_as_many_runs_at_once_as_the_round_says(monkeypatch):
    """`resample_batch_size` reaches the sampler: a sub-round of 2 prompts x 8 runs decoded
    3 rows at a time still checks all 16 runs."""
    import learner.subrounds as subrounds

    sizes = []
    real = subrounds.replay

    def seen(*args, **kwargs):
        sizes.append(kwargs["max_batch_size"])
        return real(*args, **kwargs)

    monkeypatch.setattr(subrounds, "replay", seen)
    model, tok = _mixed_model()
    config = CONFIG.model_copy(update={"subrounds": 1, "resample_batch_size": 3})
    trainer = PolicyTrainer(model, tok.pad_token_id, TrainConfig(lora_rank=8, lora_alpha=16))
    _, result = _run(trainer, tok, _served(), config)
    assert sizes == [3]
    assert result.metrics["reward_sources/verified"] == 2 * config.resample_n
