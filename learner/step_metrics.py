"""The metrics of a policy-gradient step, in TRL's vocabulary, from sums over micro-batches."""

from __future__ import annotations

import math
from collections import defaultdict

import torch

from learner.gate.stats import pearson_from_sums
from learner.samples import Sample

TOKEN_MEANS = (
    "kl",
    "clip_ratio",
    "ratio_mean",
    "behaviour_ratio_mean",
    "is_weight_mean",
    "is_truncated",
    "entropy",
)
"""`PGLoss` fields that are token means: micro-batches add them weighted by their token count."""


def add_corr_sums(sums: dict[str, float], behaviour: torch.Tensor, current: torch.Tensor) -> None:
    """Accumulate the sums a Pearson correlation of the two tokens' probabilities needs."""
    x, y = behaviour.double().exp(), current.double().exp()
    sums["c_n"] += x.numel()
    sums["c_x"] += float(x.sum())
    sums["c_y"] += float(y.sum())
    sums["c_xx"] += float((x * x).sum())
    sums["c_yy"] += float((y * y).sum())
    sums["c_xy"] += float((x * y).sum())


def probs_corr(s: dict[str, float]) -> float:
    """Correlation of behaviour and current probabilities from `add_corr_sums`; NaN if undefined."""
    keys = ("c_n", "c_x", "c_y", "c_xx", "c_yy", "c_xy")
    r = pearson_from_sums(*(s.get(k, 0.0) for k in keys))
    return math.nan if r is None else r  # a metric: NaN is "undefined this step"


def pg_metrics(
    s: dict[str, float], samples: list[Sample], current_version: int | None, with_kl: bool
) -> dict[str, float]:
    """TRL-named metrics; NaN where undefined (no reference, no logged logprobs, no groups, no versions)."""
    n = s["tokens"]
    rewards = torch.tensor([x.reward for x in samples], dtype=torch.float64)
    lags = [
        current_version - x.policy_version
        for x in samples
        if x.policy_version is not None and current_version is not None
    ]
    lag = sum(lags) / len(lags) if lags and current_version is not None else math.nan
    means = {k: s[k] / n for k in TOKEN_MEANS}
    if not with_kl:
        means["kl"] = math.nan
    return {
        "loss": s["loss"],
        **means,
        "completions/mean_length": sum(len(x.completion_ids) for x in samples) / len(samples),
        "reward": float(rewards.mean()),
        "reward_std": float(rewards.std()) if len(samples) > 1 else 0.0,
        "frac_reward_zero_std": frac_zero_std_groups(samples),
        "probs_corr": probs_corr(s),
        "policy_version_lag": lag,
        "num_tokens": n,
    }


def frac_zero_std_groups(samples: list[Sample]) -> float:
    """Share of groups (two samples or more) whose rewards are all equal: they teach nothing."""
    groups: dict[str, list[float]] = defaultdict(list)
    for x in samples:
        if x.group is not None:
            groups[x.group].append(x.reward)
    sized = [r for r in groups.values() if len(r) > 1]
    if not sized:
        return math.nan
    return sum(max(r) - min(r) <= 1e-6 for r in sized) / len(sized)
