"""A round's episodes as training input: which runs can train, in what order, which of their
turns a reward credits, and the samples, pairs and judged answers their feedback makes.

`learner.rounds` runs the round; this module holds what it reads from the episodes before any
model is touched, so each rule can be tested on its own.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Mapping, Sequence
from typing import Any

from learner.advantages import RunningBaseline
from learner.config import RoundConfig
from learner.episodes import Episode
from learner.labels import Grounding
from learner.rewards import EpisodeReward, batch_rewards, keep_turns
from learner.samples import TrainingData, build_training_data, judged_only, reads_tool_output
from learner.store import Store

log = logging.getLogger(__name__)

UNTRAINABLE = "untrainable"  # no rewarded step with logged token ids, no usable correction
NO_TOKEN_IDS = "no_token_ids"
"""Untrainable: no model step of the run logged token ids (another provider answered it)."""
BASELINE_KEY = "running_baseline"
"""The store's meta key of the running reward baseline, carried from round to round."""


def content_key(episode: Episode) -> str:
    """A digest of what an episode trains on, to order a round's episodes by.

    Which episodes a round takes is "oldest first"; the order they are batched in is this
    key, so the updates (and the float sums inside them) do not depend on which run happened
    to finish or arrive first. Episodes with equal keys are interchangeable.
    """
    t = episode.trajectory
    steps = [(s.prompt_token_ids, s.completion_token_ids) for s in t.model_steps]
    said = [(f.kind, f.value, f.text, f.turn, f.user_id) for f in episode.feedback]
    return hashlib.sha256(json.dumps([steps, t.output, said]).encode()).hexdigest()


def training_data(
    store: Store,
    episodes: Sequence[Episode],
    tokenizer: Any,
    config: RoundConfig,
    grounding: Mapping[str, Grounding],
    scored: Mapping[str, float],
) -> tuple[TrainingData, list[EpisodeReward]]:
    """Samples, pairs and judged answers from the episodes' feedback, and the rewards they
    came from; a silent run the reward model scored (`scored`, by trajectory id) gets that
    score on every turn."""
    rewards = batch_rewards(
        [e.feedback for e in episodes],
        [[s.index for s in e.trajectory.model_steps] for e in episodes],
        config.max_user_reward_share,
        config.silence_reward,
    )
    rewards = [
        model_reward(e, scored[e.trajectory.event_id]) if e.trajectory.event_id in scored else r
        for r, e in zip(rewards, episodes, strict=True)
    ]
    if not config.train_after_tool:
        rewards = [keep_turns(r, credited_turns(e)) for r, e in zip(rewards, episodes, strict=True)]
    data = build_training_data(
        episodes,
        rewards,
        encode=lambda text: tokenizer(text, add_special_tokens=False)["input_ids"],
        eos_id=tokenizer.eos_token_id,
        baseline=config.baseline,
        state=RunningBaseline(**store.get_meta(BASELINE_KEY, {})),
        normalise_rewards=config.normalise_rewards,
        # with a grounding, a correction is a label: a pair only beside a verified run
        text_pairs=lambda e: e.trajectory.agent not in grounding or config.subrounds == 0,
        judged_only=judged_only if config.kto_judgements else lambda episode: False,
    )
    return data, rewards


def model_reward(episode: Episode, score: float) -> EpisodeReward:
    """A silent run's reward from the reward model's pessimistic score, on every model turn."""
    return EpisodeReward(score, {s.index: score for s in episode.trajectory.model_steps})


def without_token_ids(store: Store, episodes: list[Episode]) -> tuple[list[Episode], int]:
    """(the episodes a model step of which logged token ids, how many had none): runs another
    provider answered cannot train; they are let go as `no_token_ids`, a count in the store
    and the round's metrics, not an error."""
    blind = [
        e
        for e in episodes
        if e.trajectory.model_steps
        and not any(s.prompt_token_ids and s.completion_token_ids for s in e.trajectory.model_steps)
    ]
    if not blind:
        return episodes, 0
    let_go(store, blind, NO_TOKEN_IDS)
    log.info("%d runs without token ids let go (another provider answered them)", len(blind))
    gone = {e.trajectory.event_id for e in blind}
    return [e for e in episodes if e.trajectory.event_id not in gone], len(blind)


def let_go(store: Store, episodes: Sequence[Episode], reason: str) -> None:
    """Settle the episodes' events as not trained on, for `reason` (a count in the store)."""
    if episodes:
        store.settle([i for e in episodes for i in e.event_ids], reason)


def credited_turns(episode: Episode) -> set[int]:
    """Model turns before the run's first tool output, and any turn feedback names.

    A turn written after a tool's output mostly reads it back (the tutor's `#### 42` after the
    calculator said 42); whole-run feedback on it judges the call before it, and training it
    with that reward adds noise and dilutes the call's tokens in the update.
    """
    named = {f.turn for f in episode.feedback if f.turn is not None}
    t = episode.trajectory
    return {s.index for s in t.model_steps if not reads_tool_output(t, s) or s.index in named}
