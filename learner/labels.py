"""From feedback to labels: the answer a logged prompt should get, where users' words say so.

A label is what a verifier can check a resampled run against (`learner.resample`). Votes,
each in log-odds under the feedback noise (`noise`: the share of judgements that are flipped):
- a positive judgement (thumbs up, rating 4-5, outcome or verifier above one half) on a run
  whose final answer the pack can read votes for that answer, a negative one against it; the
  strength is the judgement's reward (`FeedbackEvent.reward`: a 4-star rating counts
  half a thumbs-up) times logit(1 - noise);
- a correction votes for the answer its text states (`reference_from`), as strongly as a
  thumbs-up (a correction with no readable answer is no vote);
- a run answered by a pack's safe fallback states no answer of its own (its level is a
  default, not a judgement): a user's opinion of it (thumbs, rating) casts no vote. An outcome
  or a verifier's result does: it says whether what was returned was right, whoever wrote it
  (the disposition a clinician later assigned confirms the fallback's `see a doctor` as well
  as the model's). A red-flag escalation states an answer (the rules' `emergency`), so every
  judgement of it votes: that is how the loop comes to teach the model itself to escalate.
- a reviewer's verdict (kind `review`, from the annotation queue) votes as a correction for
  the answer its text states and as a result (a fallback's too) with its score, each
  `REVIEW_WEIGHT` times as strong as a user's word and never capped: a clinician's or a
  teacher's judgement outweighs a user's thumbs.
Only each sender's latest word per kind and turn counts (as for rewards). The runs of one
prompt (the agent and its normalised input text, not only identical tokens) vote together.
A user's votes are scaled by the same cap as rewards (`learner.rewards.sender_scales` over the
batch's vote mass: per credential, then per user), so one user, or one API key posing as many
users, cannot label alone what many users judged.

Each answer's confidence is a softmax over its summed votes against "none of these" at 0:
one thumbs-up at 5 % noise gives 0.95; two users who back different answers give under 0.5
each; a thumbs-down alone gives no label. The best answer is a label when its confidence
reaches `threshold`.
"""

from __future__ import annotations

import math
import re
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from agents.events import AnswerPath, FeedbackEvent, FeedbackKind, TrajectoryEvent
from learner.episodes import Episode
from learner.policy.chat_format import ToolFormat
from learner.rewards import sender_scales
from tools.base import Tool

Reader = Callable[[str], str | None]


class HeadSpec(Protocol):
    """What the learner reads of an agent's decision: the head's name and its labels."""

    name: str
    labels: tuple[str, ...]


@dataclass(frozen=True)
class Grounding:
    """What the learner knows of an agent from its pack (the learner process passes it in):
    how its answers read, for labels, and its tools and budget, to replay its runs."""

    answer_of: Reader
    """The final answer a reply states, normalised (the pack's `answer_of`)."""
    reference_from: Reader
    """The answer a user's correction states (the pack's `reference_from`)."""
    tools: tuple[Tool, ...] = ()
    max_steps: int = 3
    """Model calls per run, as the agent's graph allows."""
    tool_format: ToolFormat = "hermes"
    """How the policy server writes tools and calls (`ARLOOP_TOOL_FORMAT`, resolved)."""
    max_tokens: int | None = None
    """The agent's own token budget (None: the round's). The temperature is always the
    round's: replays explore, even for an agent served greedily."""
    stop: tuple[str, ...] = ()
    include_stop: bool = False
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    """The agent's stop sequences and penalties, so replays sample as the agent is served."""
    restate: Callable[[str, str], str | None] | None = None
    """A reply rewritten to state another answer, all else kept (the pack's `restate`)."""
    decision: HeadSpec | None = None
    """The choice the agent's version head makes (the spec's `agents.decisions.Decision`;
    `learner.decision_heads` fits it)."""


RESULTS = (FeedbackKind.OUTCOME, FeedbackKind.VERIFIER, FeedbackKind.REVIEW)
"""Judgements of whether the returned answer was right, not of how it read: they vote on a
fallback's answer too."""
REVIEW_WEIGHT = 2.0
"""A reviewer's verdict counts as this many users' words (see the module's rules)."""


@dataclass(frozen=True)
class Vote:
    """One piece of feedback's say on one answer for one prompt, in log-odds."""

    prompt: str
    answer: str
    weight: float
    sender: str
    capped: bool
    kind: str
    credential: str | None = None


@dataclass(frozen=True)
class Label:
    """The answer a prompt should get, how sure the feedback makes us, and who said so."""

    prompt: str
    answer: str
    confidence: float
    episodes: tuple[int, ...]
    """Indices (into the round's episodes) of the runs of this prompt."""
    senders: tuple[str, ...]


def prompt_key(trajectory: TrajectoryEvent) -> str:
    """The agent and the case the run answered (a reply to a follow-up question joined to
    the message it answers: two patients' "3 weeks" are two prompts), letter case, spacing
    and closing punctuation ignored."""
    text = re.sub(r"\s+", " ", trajectory.case.casefold()).strip().rstrip("?!. ")
    return f"{trajectory.agent}\x1f{text}"


def _latest(feedback: Sequence[FeedbackEvent]) -> list[FeedbackEvent]:
    latest: dict[tuple[str, str, int | None], FeedbackEvent] = {}
    for f in sorted(feedback, key=lambda f: f.created_at):
        latest[(f.user_id, f.slot, f.turn)] = f
    return list(latest.values())


def episode_votes(episode: Episode, readers: Grounding, noise: float) -> list[Vote]:
    """The votes of one episode's feedback (see the module's rules)."""
    key = prompt_key(episode.trajectory)
    strength = math.log((1.0 - noise) / noise)
    t = episode.trajectory
    stated = readers.answer_of(t.output)
    opinion = None if t.answered_by is AnswerPath.FALLBACK else stated
    votes = []
    for f in _latest(episode.feedback):
        capped = f.source == "user"
        weight = strength * (REVIEW_WEIGHT if f.kind is FeedbackKind.REVIEW else 1.0)
        if f.kind in (FeedbackKind.CORRECTION, FeedbackKind.REVIEW) and f.text:
            said = readers.reference_from(f.text)
            if said is not None:
                votes.append(Vote(key, said, weight, f.user_id, capped, f.kind.value, f.credential))
        if f.kind is FeedbackKind.CORRECTION:
            continue
        score = f.reward
        served = stated if f.kind in RESULTS else opinion
        if served is not None and score:
            votes.append(
                Vote(key, served, score * weight, f.user_id, capped, f.kind.value, f.credential)
            )
    return votes


def find_labels(
    episodes: Sequence[Episode],
    readers: Mapping[str, Grounding],
    *,
    noise: float = 0.05,
    threshold: float = 0.9,
    max_user_share: float = 0.2,
) -> dict[str, Label]:
    """Labels of the prompts whose feedback agrees enough, keyed by `prompt_key`.

    `readers` maps an agent's name to its grounding; runs of other agents get no label.
    """
    if not 0.0 < noise < 0.5:
        raise ValueError(
            f"label noise {noise} must be in (0, 0.5): the share of flipped judgements"
        )
    votes: list[tuple[int, Vote]] = []
    for i, episode in enumerate(episodes):
        r = readers.get(episode.trajectory.agent)
        if r is not None:
            votes += [(i, v) for v in episode_votes(episode, r, noise)]
    masses = [((v.sender, v.credential), abs(v.weight)) for _, v in votes if v.capped]
    scales = sender_scales(masses, max_user_share)
    sums: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    senders: dict[str, set[str]] = defaultdict(set)
    for _, v in votes:
        scale = scales[(v.sender, v.credential)] if v.capped else 1.0
        sums[v.prompt][v.answer] += v.weight * scale
        senders[v.prompt].add(v.sender)
    runs: dict[str, list[int]] = defaultdict(list)
    for i, episode in enumerate(episodes):
        runs[prompt_key(episode.trajectory)].append(i)
    labels = {}
    for prompt, by_answer in sorted(sums.items()):
        answer, confidence = _best(by_answer)
        if confidence >= threshold:
            labels[prompt] = Label(
                prompt, answer, confidence, tuple(runs[prompt]), tuple(sorted(senders[prompt]))
            )
    return labels


def _best(by_answer: Mapping[str, float]) -> tuple[str, float]:
    """(answer, confidence): the softmax of the vote sums with "none of these" at 0."""
    top = max(max(by_answer.values()), 0.0)  # shift for exp's range; "none" is exp(-top)
    weights = {a: math.exp(s - top) for a, s in by_answer.items()}
    total = math.exp(-top) + sum(weights.values())
    answer = min(weights, key=lambda a: (-weights[a], a))  # ties: the same pick every time
    return answer, weights[answer] / total
