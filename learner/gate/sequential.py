"""The gate's group-sequential test: is the candidate not worse, is it better, is it futile?

Pure (numbers in, a decision out; numpy only, no torch). Each held-out task is run k times by
both versions with the same sampling seeds (coupled), so a task gives one paired difference
d_i = mean(candidate's k outcomes) - mean(champion's). At each look (a growing prefix of a
stratified draw) the test computes the mean difference, its standard error over tasks, and
two z statistics:

- not worse: Z_ni = (mean + margin) / se, against O'Brien-Fleming boundaries at one-sided
  level `alpha_not_worse` (Lan-DeMets spending; the release question);
- improved: Z_sup = mean / se, against O'Brien-Fleming boundaries at one-sided level
  `alpha_improved` (reported, never required to release).

A question is futile when its conditional power under the current trend falls below
`futility`: "not worse" can then no longer be shown (the candidate is refused), "improved" is
no longer worth more tasks. The test stops once both questions are settled or at the last look.
Boundaries are computed for the planned looks by numerical integration of the Brownian-motion
recursion (Jennison & Turnbull, 2000, ch. 19), so each question's type I error holds whatever
look the test stops at; futility stops are non-binding (they only ever refuse or stop early).
The interval reported at the stop is the repeated confidence interval of `alpha_improved`: it
excludes 0 exactly when "improved" is shown.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache

import numpy as np

from learner.gate.stats import pearson_from_sums

NOT_WORSE, WORSE, OPEN = "not worse", "worse", "open"
IMPROVED, NOT_SHOWN = "improved", "not shown"


def _phi(x: float) -> float:
    return 0.5 * math.erfc(-x / math.sqrt(2))


def _phi_inv(p: float) -> float:
    """Inverse standard normal CDF by bisection (robust, 1e-12)."""
    lo, hi = -12.0, 12.0
    for _ in range(100):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if _phi(mid) < p else (lo, mid)
    return (lo + hi) / 2


def obf_spending(alpha: float, t: float) -> float:
    """Lan-DeMets O'Brien-Fleming-type alpha spent by information fraction t (one-sided)."""
    return 2 * (1 - _phi(_phi_inv(1 - alpha / 2) / math.sqrt(t))) if t > 0 else 0.0


@cache
def boundaries(alpha: float, fractions: tuple[float, ...], grid: int = 3201) -> tuple[float, ...]:
    """Upper z boundaries, one per look at information `fractions` (increasing, last 1), with
    P(any Z_j >= b_j | no effect) = alpha and alpha spent as `obf_spending` says."""
    bounds: list[float] = []
    s = np.linspace(-8.0, 8.0, grid)  # the score S = Z * sqrt(t), on a grid (sd <= 1)
    ds = float(s[1] - s[0])
    density = np.zeros(grid)
    prev_t, spent = 0.0, 0.0
    for t in fractions:
        step = t - prev_t
        if prev_t == 0:
            density = np.exp(-0.5 * s**2 / t) / math.sqrt(2 * math.pi * t)
        else:  # S_t = S_prev + N(0, step), over the paths that continued
            kernel = np.exp(-0.5 * (s[:, None] - s[None, :]) ** 2 / step)
            density = kernel @ density * ds / math.sqrt(2 * math.pi * step)
        target = obf_spending(alpha, t) - spent
        tail = (np.cumsum(density[::-1])[::-1] - density / 2) * ds  # P(S >= s_i), trapezoid
        i = int(np.clip(np.searchsorted(-tail, -target), 1, grid - 1))
        frac = (tail[i - 1] - target) / max(tail[i - 1] - tail[i], 1e-300)
        cut = float(s[i - 1] + min(max(frac, 0.0), 1.0) * ds)  # interpolated within the cell
        bounds.append(cut / math.sqrt(t))
        spent += target
        density = np.where(s < cut, density, 0.0)  # only paths that did not stop go on
        prev_t = t
    return tuple(bounds)


@dataclass(frozen=True)
class Look:
    """One interim analysis."""

    tasks: int
    mean: float  # candidate - champion, per task, averaged over tasks
    se: float
    z_not_worse: float
    z_improved: float
    bound_not_worse: float
    bound_improved: float
    not_worse: str  # "not worse" | "worse" | "open"
    improved: str  # "improved" | "not shown" | "open"


@dataclass(frozen=True)
class SequentialResult:
    """The test's course and its decision."""

    looks: tuple[Look, ...]
    not_worse: str
    improved: str
    ci_low: float
    ci_high: float
    """Repeated confidence interval of the difference at the stop (level 1 - 2*alpha_improved)."""
    margin: float
    champion_rate: float
    candidate_rate: float
    correlation: float | None
    """Between the versions' outcomes on the same (task, seed): what the coupling bought."""

    @property
    def stopped_at(self) -> int:
        return self.looks[-1].tasks if self.looks else 0

    @property
    def released(self) -> bool:
        return self.not_worse == NOT_WORSE

    @property
    def settled(self) -> bool:
        """Both questions answered: no further look is needed."""
        return self.not_worse != OPEN and self.improved != OPEN


def finished(result: SequentialResult, stop_when_released: bool = False) -> bool:
    """No further look is needed: both questions are settled, or, with `stop_when_released`,
    the release question ("not worse") alone."""
    return result.settled or (stop_when_released and result.not_worse != OPEN)


def _conditional_power(z: float, t: float, bound: float) -> float:
    """P(final Z >= bound | Z now, the current trend continuing)."""
    if t >= 1:
        return float(z >= bound)
    drift = z / math.sqrt(t)  # the trend, per unit of information
    mean_final = z * math.sqrt(t) + drift * (1 - t)
    return 1 - _phi((bound - mean_final) / math.sqrt(1 - t))


def sequential_test(
    champion: Sequence[Sequence[int]] | np.ndarray,
    candidate: Sequence[Sequence[int]] | np.ndarray,
    looks: Sequence[int],
    *,
    margin: float = 0.05,
    alpha_not_worse: float = 0.05,
    alpha_improved: float = 0.025,
    futility: float = 0.10,
    stop_when_released: bool = False,
) -> SequentialResult:
    """Run the looks over tasks in draw order. champion, candidate: (tasks, k) outcomes (0/1),
    row i of both from the same task and column j from the same sampling seed. `looks` is the
    whole plan (task counts, the last one the most a gate runs); looks beyond the rows given
    are left for a later call (`settled` False). Stops at the first look that settles both
    questions (or, with `stop_when_released`, the first that settles "not worse": the release
    decision is the same, "improved" may stay open)."""
    a = np.asarray(champion, dtype=np.float64)  # (n, k)
    b = np.asarray(candidate, dtype=np.float64)  # (n, k)
    if a.ndim != 2 or a.shape != b.shape or a.size == 0:
        raise ValueError("champion and candidate need the same (tasks, samples) outcome table")
    n, k = a.shape
    plan = tuple(sorted({x for x in looks if x > 0}))
    if not plan or plan[0] > n:
        raise ValueError("the sequential test needs looks of 1+ tasks, the first within the rows")
    fractions = tuple(x / plan[-1] for x in plan)
    b_ni = boundaries(alpha_not_worse, fractions)
    b_sup = boundaries(alpha_improved, fractions)
    d = b.mean(1) - a.mean(1)  # (n,) per-task differences
    done: list[Look] = []
    ni, sup = OPEN, OPEN
    for j, (m, t) in enumerate(zip(plan, fractions, strict=True)):
        if m > n:
            break  # not run yet: the caller brings the next look's tasks and asks again
        mean = float(d[:m].mean())
        # a floor of 1/sqrt(k m): m tasks whose k runs all tie are evidence, not certainty
        sd = max(float(d[:m].std(ddof=1)) if m > 1 else 0.0, 1 / math.sqrt(k * m))
        se = sd / math.sqrt(m)
        z_ni, z_sup = (mean + margin) / se, mean / se
        last = j == len(plan) - 1
        if ni == OPEN:
            if z_ni >= b_ni[j]:
                ni = NOT_WORSE
            elif last or _conditional_power(z_ni, t, b_ni[-1]) < futility:
                ni = WORSE
        if sup == OPEN:
            if z_sup >= b_sup[j]:
                sup = IMPROVED
            elif last or _conditional_power(z_sup, t, b_sup[-1]) < futility:
                sup = NOT_SHOWN
        done.append(Look(m, mean, se, z_ni, z_sup, b_ni[j], b_sup[j], ni, sup))
        if ni != OPEN and (sup != OPEN or stop_when_released):
            break
    stop = done[-1]
    half, m = stop.bound_improved * stop.se, stop.tasks
    x, y = a[:m].ravel(), b[:m].ravel()
    sums = (x.sum(), y.sum(), (x * x).sum(), (y * y).sum(), (x * y).sum())
    return SequentialResult(
        looks=tuple(done),
        not_worse=ni,
        improved=sup,
        ci_low=stop.mean - half,
        ci_high=stop.mean + half,
        margin=margin,
        champion_rate=float(a[:m].mean()),
        candidate_rate=float(b[:m].mean()),
        correlation=pearson_from_sums(float(x.size), *map(float, sums)),
    )
