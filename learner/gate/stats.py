"""The statistics behind release decisions: a paired eval comparison, an always-valid sequential
test, and the one Pearson correlation (guards and training metrics)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class PairedComparison:
    """Candidate vs champion on the same tasks (1 = solved, 0 = not)."""

    n: int
    champion_rate: float
    candidate_rate: float
    diff: float  # candidate - champion
    ci_low: float  # 95 % interval of diff (Newcombe, paired)
    ci_high: float
    p_worse: float  # one-sided exact McNemar p-value for "candidate is worse"
    test: str = "exact one-sided McNemar on discordant pairs; 95% Newcombe interval (method 10)"


def paired_comparison(champion: Sequence[int], candidate: Sequence[int]) -> PairedComparison:
    """Compare two policies' binary outcomes on the same tasks."""
    if len(champion) != len(candidate) or not champion:
        raise ValueError("paired comparison needs two equally long, non-empty outcome lists")
    n = len(champion)
    b = sum(1 for a, c in zip(champion, candidate, strict=True) if a and not c)  # champion only
    c_ = sum(1 for a, c in zip(champion, candidate, strict=True) if c and not a)  # candidate only
    p1, p2 = sum(champion) / n, sum(candidate) / n
    low, high = _newcombe_paired(n, sum(champion), sum(candidate), b, c_)
    # Under H0 the discordant pairs split 50/50; "worse" means many champion-only pairs.
    p_worse = _binom_sf(b, b + c_) if b + c_ else 1.0
    return PairedComparison(n, p1, p2, p2 - p1, low, high, p_worse)


def _binom_sf(k: int, n: int) -> float:
    """P(X >= k) for X ~ Binomial(n, 1/2)."""
    return sum(math.comb(n, i) for i in range(k, n + 1)) / 2**n


def paired_intervals(cmp: PairedComparison) -> dict[str, object]:
    """Each side's solved count and Wilson 95% interval (the dashboard shows them)."""
    champion = round(cmp.champion_rate * cmp.n)
    candidate = round(cmp.candidate_rate * cmp.n)
    return {
        "champion_solved": champion,
        "candidate_solved": candidate,
        "champion_ci": list(wilson(champion, cmp.n)),
        "candidate_ci": list(wilson(candidate, cmp.n)),
    }


def wilson(successes: int, n: int, z: float = 1.959964) -> tuple[float, float]:
    """Wilson score interval of a proportion."""
    if n == 0:
        return 0.0, 1.0
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def _newcombe_paired(n: int, s1: int, s2: int, b: int, c: int) -> tuple[float, float]:
    """Newcombe's method 10 interval for a difference of paired proportions (p2 - p1)."""
    l1, u1 = wilson(s1, n)
    l2, u2 = wilson(s2, n)
    p1, p2 = s1 / n, s2 / n
    d = p2 - p1
    a = s1 - b  # both solved
    dd = n - a - b - c  # neither
    denom = math.sqrt((a + b) * (c + dd) * (a + c) * (b + dd))
    cross = a * dd - b * c
    # Newcombe's continuity-corrected phi: shrink a positive correlation by n/2.
    cross = max(cross - n / 2, 0) if cross > 0 else cross
    phi = cross / denom if denom > 0 else 0.0
    low = d - math.sqrt(max((p2 - l2) ** 2 - 2 * phi * (p2 - l2) * (u1 - p1) + (u1 - p1) ** 2, 0.0))
    high = d + math.sqrt(
        max((u2 - p2) ** 2 - 2 * phi * (u2 - p2) * (p1 - l1) + (p1 - l1) ** 2, 0.0)
    )
    return max(-1.0, low), min(1.0, high)


@dataclass(frozen=True)
class SequentialDecision:
    """Where a canary stands: the running difference and an always-valid interval around it."""

    n_champion: int
    n_candidate: int
    diff: float  # mean(candidate) - mean(champion)
    ci_low: float
    ci_high: float
    verdict: str  # "promote" | "rollback" | "continue"
    test: str = "normal-mixture confidence sequence (always valid under continuous monitoring)"


def sequential_compare(
    champion: Sequence[float],
    candidate: Sequence[float],
    *,
    alpha: float = 0.05,
    margin: float = 0.05,
    min_per_arm: int = 30,
    scale: float = 1.0,
    rho: float | None = None,
) -> SequentialDecision:
    """Compare live rewards of two arms so it may be checked after every new event.

    Rewards are assumed bounded within a range of width `scale` (sub-Gaussian with sigma =
    scale / 2). Rollback as soon as the interval lies below 0; promote once each arm has
    `min_per_arm` and the interval's low end is above -margin; else continue.
    """
    n1, n2 = len(champion), len(candidate)
    if n1 == 0 or n2 == 0:
        return SequentialDecision(n1, n2, 0.0, -scale, scale, "continue")
    diff = sum(candidate) / n2 - sum(champion) / n1
    sigma2 = (scale / 2) ** 2
    n_eff = 1.0 / (1.0 / n1 + 1.0 / n2)  # variance of diff = sigma2 / n_eff
    radius = _normal_mixture_radius(n_eff, sigma2, alpha, rho or 10.0 * sigma2)
    low, high = diff - radius, diff + radius
    if high < 0:
        verdict = "rollback"
    elif min(n1, n2) >= min_per_arm and low > -margin:
        verdict = "promote"
    else:
        verdict = "continue"
    return SequentialDecision(n1, n2, diff, low, high, verdict)


def _normal_mixture_radius(n: float, sigma2: float, alpha: float, rho: float) -> float:
    """Two-sided normal-mixture boundary for a mean of n sigma-sub-Gaussian observations.

    From Howard et al. (2021), eq. (14) with a N(0, 1/rho) mixture, divided by n to bound the mean.
    """
    v = sigma2 * n
    return math.sqrt(2 * (v + rho) * math.log(math.sqrt((v + rho) / rho) / (alpha / 2))) / n


FLAT = 1e-12
"""A side whose variance is below this share of its mean square does not vary (rounding only)."""


def pearson(xs: Sequence[float], ys: Sequence[float]) -> float | None:
    """Pearson correlation; None when the lengths differ, there are fewer than 2, or a side is flat."""
    if len(xs) != len(ys):
        return None
    products = (x * y for x, y in zip(xs, ys, strict=True))
    squares_x, squares_y = (x * x for x in xs), (y * y for y in ys)
    sums = math.fsum(xs), math.fsum(ys), math.fsum(squares_x), math.fsum(squares_y)
    return pearson_from_sums(len(xs), *sums, math.fsum(products))


def pearson_from_sums(
    n: float, sx: float, sy: float, sxx: float, syy: float, sxy: float
) -> float | None:
    """`pearson` from sums over the pairs (count, x, y, x², y², xy), for data seen in parts."""
    var_x, var_y = n * sxx - sx * sx, n * syy - sy * sy  # n² times the variances
    if n < 2 or var_x <= FLAT * n * sxx or var_y <= FLAT * n * syy:
        return None
    return (n * sxy - sx * sy) / math.sqrt(var_x * var_y)
