"""Rewarded episodes to training data: one Sample per logged model step, pairs from corrections.

Only the token ids the policy endpoint logged are used (a step without them is skipped and
counted, never re-tokenised: a re-tokenisation need not match what the policy sampled).
A sample's advantage compares its reward with samples of other episodes of the same prompt
group (GRPO, when the group holds two or more episodes: `metadata["group"]`, else identical
first prompt ids), else with the rest of the batch (RLOO) or a running mean across rounds.
A correction of an answer the model wrote from a tool's output is not made a pair (counted:
see `build_training_data`). A served answer judged only by thumbs or ratings and alone for its
prompt can go to KTO instead (`Judged`): with no group its policy-gradient advantage would
compare it with other prompts, whose difficulty swamps the judgement. A run whose answer a
pack's envelope or fallback wrote (`TrajectoryEvent.answered_by`) gives neither samples nor
pairs: its feedback judges text the model did not write (counted as `replaced_answers`; its
prompt can still be labelled and replayed, `learner.labels`).

Where a pack can restate a reply with another answer (`Grounding.restate`), a labelled
prompt's runs whose model stated another answer, whoever answered the user, each give a pair
that differs in the decision alone (`restated_pairs`): the model's own last reply restated
with the label is preferred to it as written. The clinician's disposition then trains the
level token in the model's own context, not a text nobody sampled.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import torch

from agents.events import AnswerPath, FeedbackKind, ModelStep, TrajectoryEvent
from learner.advantages import (
    RunningBaseline,
    group_advantages,
    rloo_advantages,
    running_baseline_advantages,
)
from learner.config import Baseline
from learner.episodes import Episode
from learner.labels import Grounding, Label
from learner.policy.registry import version_number
from learner.rewards import EpisodeReward


@dataclass
class Sample:
    """One logged completion to learn from, with its advantage (see `learner.advantages`)."""

    prompt_ids: list[int]
    completion_ids: list[int]
    advantage: float
    behaviour_logprobs: list[float] | None = None
    """Logprobs the serving policy gave each completion token; None: the proximal's (weight 1)."""
    proximal_logprobs: list[float] | None = None
    """Logprobs of the policy that first trained on this sample, or generated it (the PPO clip's
    anchor); None: set at first use. NaN where loss_mask is 0 (never computed, never read)."""
    loss_mask: list[int] | None = None
    """One 0/1 per completion token; 0 = excluded (e.g. tool output spliced into the completion)."""
    reward: float = 0.0
    group: str | None = None
    """Samples of the same prompt share a group (GRPO); feeds `frac_reward_zero_std`."""
    policy_version: int | None = None


@dataclass
class PreferencePair:
    """A prompt with a preferred and a rejected completion (e.g. a user's correction)."""

    prompt_ids: list[int]
    chosen_ids: list[int]
    rejected_ids: list[int]
    nll_weight: float = 0.0
    """Weight of a cross-entropy on `chosen_ids[nll_from:]` beside the DPO loss (0: none)."""
    nll_from: int = 0


@dataclass
class Judged:
    """A served answer users only judged (thumbs, ratings), for KTO: desirable or not."""

    prompt_ids: list[int]
    completion_ids: list[int]
    desirable: bool
    weight: float = 1.0
    """|reward| after the per-user cap: a capped user's judgement weighs less."""


JUDGEMENTS = frozenset({FeedbackKind.THUMBS, FeedbackKind.RATING})


def judged_only(episode: Episode) -> bool:
    """Whether users only judged the run (thumbs, ratings): no correction, outcome or verifier."""
    fb = episode.feedback
    return bool(fb) and all(f.kind in JUDGEMENTS and f.source == "user" for f in fb)


@dataclass
class TrainingData:
    """What one round trains on, and what it could not use."""

    samples: list[Sample] = field(default_factory=list)
    pairs: list[PreferencePair] = field(default_factory=list)
    judged: list[Judged] = field(default_factory=list)
    """Answers alone for their prompt and only judged, when the round trains those by KTO."""
    used: list[int] = field(default_factory=list)  # indices of episodes with a sample or pair
    skipped_steps: int = 0  # rewarded model steps without logged token ids
    skipped_corrections: int = 0  # corrections of an answer read off a tool's output
    replaced_answers: int = 0  # runs answered by an envelope or fallback: not the model's text
    baseline: RunningBaseline = field(default_factory=RunningBaseline)


def group_key(trajectory: TrajectoryEvent) -> str:
    """The prompt group: metadata["group"], else a hash of the first logged prompt, else its id."""
    if "group" in trajectory.metadata:
        return "g:" + trajectory.metadata["group"]
    for step in trajectory.model_steps:
        if step.prompt_token_ids:
            digest = hashlib.sha1(json.dumps(step.prompt_token_ids).encode()).hexdigest()[:16]
            return "p:" + digest
    return "t:" + trajectory.event_id


def _has_ids(step: ModelStep) -> bool:
    return bool(step.prompt_token_ids) and bool(step.completion_token_ids)


def sample_advantages(
    rewards: Sequence[float],
    groups: Sequence[str],
    episodes: Sequence[int],
    baseline: Baseline,
    state: RunningBaseline,
    scale_batch_std: bool = True,
) -> tuple[list[float], RunningBaseline]:
    """Per-sample advantages: centred on the group mean inside groups of 2+ episodes, on RLOO or
    a running mean elsewhere; then divided by the batch's reward std (TRL's `scale_rewards=
    "batch"`). A tied group gets 0; a group that differs only by a little noise keeps small
    advantages, where scaling by its own std would blow them up to about ±1.5."""
    n = len(rewards)
    r = torch.tensor(list(rewards), dtype=torch.float64)  # (N,)
    adv = torch.zeros(n, dtype=torch.float64)  # (N,)
    members: dict[str, set[int]] = {}
    for g, e in zip(groups, episodes, strict=True):
        members.setdefault(g, set()).add(e)
    grouped = [i for i in range(n) if len(members[groups[i]]) > 1]
    single = [i for i in range(n) if len(members[groups[i]]) == 1]
    if grouped:
        names = sorted({groups[i] for i in grouped})
        ids = torch.tensor([names.index(groups[i]) for i in grouped])  # (G,)
        adv[grouped] = group_advantages(r[grouped], ids, scale_std=False)
    if single and baseline == "rloo":
        adv[single] = rloo_advantages(r[single])
    elif single:
        adv[single], state = running_baseline_advantages(r[single], state)
    if scale_batch_std and n > 1:
        adv = adv / (r.std() + 1e-4)
    return adv.tolist(), state


def corrected_step(episode: Episode) -> tuple[str, ModelStep] | None:
    """(text, model step) of the episode's latest correction: the named turn, else the last."""
    corrections = [f for f in episode.feedback if f.kind is FeedbackKind.CORRECTION]
    if not corrections:
        return None
    latest = max(corrections, key=lambda f: f.created_at)
    steps = [s for s in episode.trajectory.model_steps if _has_ids(s)]
    if latest.turn is not None:
        steps = [s for s in steps if s.index == latest.turn]
    return (latest.text or "", steps[-1]) if steps else None


def reads_tool_output(trajectory: TrajectoryEvent, step: ModelStep) -> bool:
    """Whether a tool's output was in the step's prompt: a tool step came before it, or (a
    team's agent that runs its own tools, `/v1/chat/completions`) its messages hold more `tool`
    turns than the run's first call did. The first call's are the prompt's own (few-shot
    examples, an earlier conversation), not an output this run produced."""
    if any(t.index < step.index for t in trajectory.tool_steps):
        return True
    first = trajectory.model_steps[0] if trajectory.model_steps else step
    return _tool_turns(step.messages) > _tool_turns(first.messages)


def _tool_turns(messages: Sequence[dict]) -> int:
    return sum(1 for m in messages if m.get("role") == "tool")


def preference_pair(
    text: str, step: ModelStep, encode: Callable[[str], list[int]], eos_id: int
) -> PreferencePair | None:
    """A correction as a pair: the logged completion of `step` loses to the user's `text`."""
    chosen = encode(text) + [eos_id]
    if chosen == step.completion_token_ids:
        return None  # the user "corrected" it to what it already said
    return PreferencePair(list(step.prompt_token_ids), chosen, list(step.completion_token_ids))


def restated_pairs(
    episodes: Sequence[Episode],
    labels: Mapping[str, Label],
    grounding: Mapping[str, Grounding],
    decode: Callable[[list[int]], str],
    encode: Callable[[str], list[int]],
    eos_id: int,
    nll_weight: float = 0.0,
) -> list[PreferencePair]:
    """For each labelled prompt's run whose model's last reply states another answer than the
    label (or none): that reply restated with the label, preferred to it as written. The
    chosen side keeps the logged tokens up to the first changed character; `nll_weight`
    weighs a cross-entropy on the tokens after it (the label)."""
    pairs = []
    for label in sorted(labels.values(), key=lambda lb: lb.prompt):
        for i in label.episodes:
            trajectory = episodes[i].trajectory
            g = grounding.get(trajectory.agent)
            step = answer_step(trajectory)
            if g is None or g.restate is None or step is None:
                continue
            ids = list(step.completion_token_ids or [])
            trail = ids[-1:] if ids and ids[-1] == eos_id else []
            body = ids[: len(ids) - len(trail)]
            text = decode(body)
            restated = g.restate(text, label.answer)
            if g.answer_of(text) == label.answer or restated is None or restated == text:
                continue
            kept, chosen = _restated_ids(body, text, restated, decode, encode)
            prompt = list(step.prompt_token_ids or [])
            pairs.append(PreferencePair(prompt, chosen + trail, ids, nll_weight, kept))
    return pairs


def answer_step(trajectory: TrajectoryEvent) -> ModelStep | None:
    """The run's last model step, if it answered (no tool call) and logged its tokens."""
    steps = trajectory.model_steps
    if not steps or steps[-1].tool_calls or not _has_ids(steps[-1]):
        return None
    return steps[-1]


def _restated_ids(
    ids: list[int],
    text: str,
    restated: str,
    decode: Callable[[list[int]], str],
    encode: Callable[[str], list[int]],
) -> tuple[int, list[int]]:
    """(k, `restated` as tokens): the logged `ids[:k]` of the longest unchanged head, the rest
    encoded."""
    same = os.path.commonprefix([text, restated])
    k = len(ids)
    while k and not same.startswith(decode(ids[:k])):
        k -= 1
    head = decode(ids[:k])
    return k, ids[:k] + encode(restated[len(head) :])


def build_training_data(
    episodes: Sequence[Episode],
    rewards: Sequence[EpisodeReward],
    *,
    encode: Callable[[str], list[int]],
    eos_id: int,
    baseline: Baseline = "rloo",
    state: RunningBaseline | None = None,
    normalise_rewards: bool = True,
    text_pairs: Callable[[Episode], bool] = lambda episode: True,
    judged_only: Callable[[Episode], bool] = lambda episode: False,
) -> TrainingData:
    """Samples (one per rewarded model step with token ids), DPO pairs and KTO answers.

    `text_pairs(episode)` False: the episode's correction makes no pair from the user's text
    (its agent's pack reads corrections as labels, `learner.subrounds`); it is counted.
    `judged_only(episode)` True for an episode alone in its prompt group: its rewarded steps
    become `Judged` answers (desirable when their reward is above 0; a neutral 0 trains
    nothing) instead of policy-gradient samples.
    """
    data = TrainingData(baseline=state or RunningBaseline())
    rows: list[tuple[int, ModelStep, float]] = []
    for e, (episode, reward) in enumerate(zip(episodes, rewards, strict=True)):
        if not answered_by_model(episode.trajectory):
            data.replaced_answers += 1
            continue
        for step in episode.trajectory.model_steps:
            if step.index not in reward.turns:
                continue
            if not _has_ids(step):
                data.skipped_steps += 1
                continue
            rows.append((e, step, reward.turns[step.index]))
        found = corrected_step(episode)
        if found is not None and not text_pairs(episode):
            data.skipped_corrections += 1
        elif found is not None and reads_tool_output(episode.trajectory, found[1]):
            # preferred *given the tool's output*, the user's text would teach the model to
            # contradict its tools, while the mistake was upstream (the call); the run still
            # learns from its thumbs and ratings
            data.skipped_corrections += 1
        elif found is not None and (pair := preference_pair(*found, encode, eos_id)) is not None:
            data.pairs.append(pair)
            data.used.append(e)
    rows = _split_judged(episodes, rows, judged_only, data)
    if rows:
        values = [r for _, _, r in rows]
        groups = [group_key(episodes[e].trajectory) for e, _, _ in rows]
        adv, data.baseline = sample_advantages(
            values, groups, [e for e, _, _ in rows], baseline, data.baseline, normalise_rewards
        )
        made = zip(rows, adv, groups, strict=True)
        data.samples = [_sample(step, a, r, g) for (_, step, r), a, g in made]
    data.used = sorted(set(data.used) | {e for e, _, _ in rows})
    return data


def _split_judged(
    episodes: Sequence[Episode],
    rows: list[tuple[int, ModelStep, float]],
    judged_only: Callable[[Episode], bool],
    data: TrainingData,
) -> list[tuple[int, ModelStep, float]]:
    """Move the rows of judged-only episodes alone in their group to `data.judged`; the rest.

    KTO's reference point needs two answers or more: a single one stays policy gradient.
    """
    members: dict[str, set[int]] = {}
    for e, _, _ in rows:
        members.setdefault(group_key(episodes[e].trajectory), set()).add(e)
    alone = {e for group in members.values() if len(group) == 1 for e in group}
    kto = {e for e in alone if judged_only(episodes[e])}
    judged = [(e, step, r) for e, step, r in rows if e in kto and r != 0]
    if len(judged) < 2:
        return rows
    for e, step, r in judged:
        ids = list(step.prompt_token_ids or []), list(step.completion_token_ids or [])
        data.judged.append(Judged(*ids, r > 0, abs(r)))
        data.used.append(e)
    return [row for row in rows if row[0] not in kto]


def answered_by_model(trajectory: TrajectoryEvent) -> bool:
    """Whether the user got the model's own answer (not a pack's envelope or fallback)."""
    return trajectory.answered_by is AnswerPath.MODEL


def _sample(step: ModelStep, advantage: float, reward: float, group: str) -> Sample:
    logprobs = step.logprobs
    if logprobs is not None and len(logprobs) != len(step.completion_token_ids or []):
        logprobs = None  # a mismatched log cannot be an importance ratio: treat as on-policy
    return Sample(
        prompt_ids=list(step.prompt_token_ids or []),
        completion_ids=list(step.completion_token_ids or []),
        advantage=advantage,
        behaviour_logprobs=list(logprobs) if logprobs is not None else None,
        reward=reward,
        group=group,
        policy_version=version_number(step.policy_version),
    )
