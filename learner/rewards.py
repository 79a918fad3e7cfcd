"""From feedback to rewards: one scalar per trajectory, one per turn, capped per user (pure).

The rule, in order:
1. Each feedback's score is the reward decided when it arrived (`FeedbackEvent.reward`, in
   [-1, 1]: by its kind, `agents.events.kind_reward`, or a named score by its pack's rule;
   None: not learned from). Nothing here maps a value to a reward. A correction has no
   score: it becomes a label or a preference pair (see `learner/samples.py`).
2. Within an episode only the latest word of each (sender, kind, turn) counts (each named score
   is a kind of its own): a user who turns a thumbs-up into a thumbs-down is counted once,
   with the down.
3. Poisoning cap: over the batch, a user's reward mass is the sum of |score| of what they sent;
   no user may hold more than `max_user_share` of the total user mass (raised to 1/n when n
   users cannot all fit under it). Users above are scaled down, water-filling style, so the
   cap holds after scaling. The same cap holds per credential first (the API key the feedback
   came with, all its users together: one key posing as 130 users is one sender), then per
   user on what is left; feedback without a credential is its user's own group. Verifier and
   system feedback are not a user's and are not capped.
4. The trajectory's reward is the mean of its scores about the whole run (feedback without a
   turn), else the mean of all its scores. A turn's reward is the mean of the scores naming
   that turn (`FeedbackEvent.turn` = the `ModelStep.index`), else the trajectory's reward
   about the whole run; a turn with neither is not trained on.
5. An episode with no feedback at all gets `silence_reward` on every turn (None: no reward).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Collection, Sequence
from dataclasses import dataclass, replace

from agents.events import FeedbackEvent


@dataclass(frozen=True)
class Scored:
    """One piece of feedback as a score, with who sent it and what it is about."""

    sender: str
    capped: bool  # True for a user's feedback, False for verifiers and the system
    kind: str
    turn: int | None
    score: float
    at: float
    credential: str | None = None  # the API key it came with (None: its user's own group)


@dataclass(frozen=True)
class EpisodeReward:
    reward: float | None  # the trajectory's scalar; None: nothing to learn by policy gradient
    turns: dict[int, float]  # model step index -> that turn's reward


def scored(feedback: Sequence[FeedbackEvent]) -> list[Scored]:
    """Scores of an episode's feedback, latest word per (sender, kind, turn) only."""
    latest: dict[tuple[str, str, int | None], Scored] = {}
    for f in sorted(feedback, key=lambda f: f.created_at):
        score = f.reward
        if score is not None:
            key = (f.user_id, f.slot, f.turn)
            latest[key] = Scored(
                f.user_id,
                f.source == "user",
                f.slot,
                f.turn,
                score,
                f.created_at,
                f.credential,
            )
    return list(latest.values())


def user_scales(masses: dict[str, float], max_share: float) -> dict[str, float]:
    """Factor per user so that no user's mass exceeds `max_share` of the scaled total.

    With k users capped at C and uncapped mass U, C = s (k C + U), so C = s U / (1 - s k);
    k grows from 0 until the next user's mass fits under C. s = max(max_share, 1/n) keeps
    this feasible (n users cannot each hold less than 1/n).
    """
    ranked = sorted(((m, u) for u, m in masses.items() if m > 0), reverse=True)
    scales = {u: 1.0 for u in masses}
    if not ranked:
        return scales
    share = max(max_share, 1.0 / len(ranked))
    free = sum(m for m, _ in ranked)
    k, cap = 0, share * free
    for k, (mass, _) in enumerate(ranked):  # noqa: B007 - k is used after the loop
        cap = share * free / (1.0 - share * k)
        if mass <= cap * (1 + 1e-12):
            break
        free -= mass
    for mass, user in ranked[:k]:
        scales[user] = cap / mass
    return scales


Sender = tuple[str, str | None]
"""(user, credential) of capped feedback."""


def sender_scales(masses: Sequence[tuple[Sender, float]], max_share: float) -> dict[Sender, float]:
    """Factor per sender: `user_scales` over credentials (all of a key's users together),
    then over users on the masses that leaves (rule 3)."""
    pairs: dict[Sender, float] = defaultdict(float)
    for sender, mass in masses:
        pairs[sender] += mass
    groups: dict[str, float] = defaultdict(float)
    for sender, mass in pairs.items():
        groups[_group(sender)] += mass
    first = user_scales(dict(groups), max_share)
    users: dict[str, float] = defaultdict(float)
    for sender, mass in pairs.items():
        users[sender[0]] += mass * first[_group(sender)]
    second = user_scales(dict(users), max_share)
    return {s: first[_group(s)] * second[s[0]] for s in pairs}


def _group(sender: Sender) -> str:
    user, credential = sender
    return f"key\x1f{credential}" if credential is not None else f"user\x1f{user}"


def mean_score(items: Sequence[Scored]) -> float | None:
    return sum(i.score for i in items) / len(items) if items else None


def episode_reward(items: Sequence[Scored], turn_indices: Sequence[int]) -> EpisodeReward:
    """The trajectory's reward and each turn's (rule 4 above)."""
    whole = mean_score([i for i in items if i.turn is None])
    turns: dict[int, float] = {}
    for t in turn_indices:
        own = mean_score([i for i in items if i.turn == t])
        r = own if own is not None else whole
        if r is not None:
            turns[t] = r
    return EpisodeReward(whole if whole is not None else mean_score(items), turns)


def batch_rewards(
    feedback: Sequence[Sequence[FeedbackEvent]],
    turn_indices: Sequence[Sequence[int]],
    max_user_share: float,
    silence_reward: float | None,
) -> list[EpisodeReward]:
    """Rewards for a batch of episodes, given each one's feedback and model-step indices."""
    items = [scored(f) for f in feedback]
    masses = [((i.sender, i.credential), abs(i.score)) for ep in items for i in ep if i.capped]
    scales = sender_scales(masses, max_user_share)
    out = []
    for fb, ep, turns in zip(feedback, items, turn_indices, strict=True):
        if not fb:
            silent = {t: silence_reward for t in turns} if silence_reward is not None else {}
            out.append(EpisodeReward(silence_reward, silent))
            continue
        ep = [
            replace(i, score=i.score * scales[(i.sender, i.credential)]) if i.capped else i
            for i in ep
        ]
        out.append(episode_reward(ep, turns))
    return out


def keep_turns(reward: EpisodeReward, turns: Collection[int]) -> EpisodeReward:
    """The reward with only `turns` left to train (the trajectory's scalar unchanged)."""
    return replace(reward, turns={t: r for t, r in reward.turns.items() if t in turns})
