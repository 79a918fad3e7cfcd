"""Logged runs as the gate reads them: rewards, answer lengths, reward sources, importance weights.

A run's reward is the learner's own (`learner.rewards.batch_rewards`, per-user caps included);
its reward sources are "user" (every user pooled) or the sender of verifier and system
feedback (`verifier`, `judge`, ...), each with its mean score in [-1, 1]. Only runs whose every
model step logged token ids and behaviour logprobs can be re-weighted.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from agents.events import FeedbackEvent, TrajectoryEvent
from learner.gate.ope import OPEEstimate, snis, too_few
from learner.rewards import batch_rewards, scored

Step = tuple[list[int], list[int], list[float]]  # prompt ids, completion ids, behaviour logprobs
LogprobFn = Callable[[list[tuple[list[int], list[int]]]], list[torch.Tensor]]


@dataclass(frozen=True)
class LoggedRun:
    """One logged run reduced to what the gate's figures need."""

    trajectory_id: str
    policy_version: str
    reward: float | None
    sources: dict[str, float]
    answer_tokens: int | None
    steps: tuple[Step, ...]  # model steps with ids and logprobs; all of them when `complete`
    complete: bool


def logged_runs(
    pairs: Sequence[tuple[TrajectoryEvent, Sequence[FeedbackEvent]]], max_user_share: float = 1.0
) -> list[LoggedRun]:
    """Runs with their batch rewards (computed over these runs together, as a round does)."""
    rewards = batch_rewards(
        [f for _, f in pairs],
        [[s.index for s in t.model_steps] for t, _ in pairs],
        max_user_share,
        None,
    )
    return [_run(t, f, r.reward) for (t, f), r in zip(pairs, rewards, strict=True)]


def _run(t: TrajectoryEvent, feedback: Sequence[FeedbackEvent], reward: float | None) -> LoggedRun:
    steps = [_step(s.prompt_token_ids, s.completion_token_ids, s.logprobs) for s in t.model_steps]
    usable = tuple(s for s in steps if s is not None)
    return LoggedRun(
        trajectory_id=t.event_id,
        policy_version=t.policy_version,
        reward=reward,
        sources=source_scores(feedback),
        answer_tokens=answer_tokens(t),
        steps=usable,
        complete=bool(steps) and len(usable) == len(steps),
    )


def _step(prompt: list[int] | None, completion: list[int] | None, lp: list[float] | None):
    if not prompt or not completion or lp is None or len(lp) != len(completion):
        return None
    return (list(prompt), list(completion), list(lp))


def answer_tokens(t: TrajectoryEvent) -> int | None:
    """Tokens of the final model step (the answer the user saw), when logged."""
    steps = t.model_steps
    ids = steps[-1].completion_token_ids if steps else None
    return len(ids) if ids else None


def source_scores(feedback: Sequence[FeedbackEvent]) -> dict[str, float]:
    """Each reward source's mean score of one run (latest word per sender, kind and turn)."""
    by_source: dict[str, list[float]] = {}
    for s in scored(feedback):
        by_source.setdefault("user" if s.capped else s.sender, []).append(s.score)
    return {k: sum(v) / len(v) for k, v in by_source.items()}


def log_ratios(runs: Sequence[LoggedRun], candidate_logprobs: LogprobFn) -> list[tuple[float, int]]:
    """Per run: (sum over its completion tokens of log candidate - log behaviour, token count)."""
    flat = [(p, c) for r in runs for p, c, _ in r.steps]
    recomputed = iter(candidate_logprobs(flat))
    out = []
    for r in runs:
        total, n = 0.0, 0
        for _, c, behaviour in r.steps:
            total += float(next(recomputed).double().sum()) - math.fsum(behaviour)
            n += len(c)
        out.append((total, n))
    return out


def importance_gain(rewards: Sequence[float], ratios: Sequence[tuple[float, int]]) -> float | None:
    """Self-normalised, length-normalised importance estimate of the candidate's reward minus the
    logged mean: weights exp(mean per-token log ratio), so the direction survives long answers
    whose whole-sequence weights would degenerate (the sign matters, not the size)."""
    pairs = [(r, s / n) for r, (s, n) in zip(rewards, ratios, strict=True) if n > 0]
    if len(pairs) < 2:
        return None
    top = max(m for _, m in pairs)
    w = [math.exp(m - top) for _, m in pairs]
    estimate = sum(wi * r for wi, (r, _) in zip(w, pairs, strict=True)) / sum(w)
    return estimate - sum(r for r, _ in pairs) / len(pairs)


def off_policy_estimate(
    runs: Sequence[LoggedRun], candidate_logprobs: LogprobFn, min_ess: float
) -> OPEEstimate:
    """SNIS on the complete, rewarded runs: whole-response importance weights."""
    usable = [r for r in runs if r.complete and r.reward is not None]
    if not usable:
        return snis(torch.zeros(0), torch.zeros(0), torch.zeros(0), min_ess=min_ess)
    refused = too_few([r.reward for r in usable], min_ess)  # before the model's forward passes
    if refused is not None:
        return refused
    ratios = log_ratios(usable, candidate_logprobs)
    rewards = torch.tensor([r.reward for r in usable], dtype=torch.float64)  # (N,)
    log_w = torch.tensor([s for s, _ in ratios], dtype=torch.float64)  # (N,)
    return snis(rewards, torch.zeros_like(log_w), log_w, min_ess=min_ess)
