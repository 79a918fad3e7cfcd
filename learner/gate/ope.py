"""Off-policy evaluation: a candidate's expected reward on logged traffic, before any user sees it."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class OPEEstimate:
    """Self-normalised importance sampling estimate with its effective sample size."""

    n: int
    behaviour_mean: float  # plain mean reward of the logged (behaviour) traffic
    estimate: float | None  # candidate's expected reward; None when we refuse to conclude
    ci_low: float | None
    ci_high: float | None
    ess: float  # effective sample size (sum w)^2 / sum w^2; 0 when not computed (`too_few`)
    min_ess: float
    max_weight_share: float  # the largest single weight's share of the total
    reason: str
    method: str = "self-normalised importance sampling, delta-method 95% interval"


def too_few(rewards: list[float], min_ess: float) -> OPEEstimate | None:
    """The refusal when fewer runs are logged than `min_ess`: an effective sample size never
    exceeds the number of runs, so no weights could conclude (none are computed); else None."""
    n = len(rewards)
    if n == 0 or n >= min_ess:
        return None
    reason = (
        f"only {n} logged runs, and an effective sample size of {min_ess:g} needs at least as "
        "many: collect more or use the eval suite"
    )
    return OPEEstimate(n, sum(rewards) / n, None, None, None, 0.0, min_ess, 0.0, reason)


def snis(
    rewards: torch.Tensor,
    behaviour_logp: torch.Tensor,
    candidate_logp: torch.Tensor,
    *,
    min_ess: float = 30.0,
    z: float = 1.959964,
) -> OPEEstimate:
    """Estimate E_candidate[reward] from logged (reward, behaviour logp, candidate logp) triples.

    Log-probabilities are of each whole logged response (sum over its completion tokens).
    Refuses (estimate None) when the effective sample size is below `min_ess`.
    """
    rewards = rewards.double()  # (N,)
    n = rewards.numel()
    if n == 0:
        return OPEEstimate(0, 0.0, None, None, None, 0.0, min_ess, 0.0, "no logged traffic")
    log_w = candidate_logp.double() - behaviour_logp.double()  # (N,)
    w = torch.exp(log_w - log_w.max())  # scale-free: SNIS is invariant to a common factor
    w_sum = w.sum()
    ess = float(w_sum**2 / (w**2).sum())
    share = float(w.max() / w_sum)
    behaviour_mean = float(rewards.mean())
    if ess < min_ess:
        reason = (
            f"effective sample size {ess:.1f} < {min_ess:g}: the candidate moved too far from "
            "the logged policy for this traffic to say anything; collect more or use the eval suite"
        )
        return OPEEstimate(n, behaviour_mean, None, None, None, ess, min_ess, share, reason)
    mu = float((w * rewards).sum() / w_sum)
    var = float((w**2 * (rewards - mu) ** 2).sum() / w_sum**2)
    half = z * math.sqrt(var)
    return OPEEstimate(n, behaviour_mean, mu, mu - half, mu + half, ess, min_ess, share, "ok")
