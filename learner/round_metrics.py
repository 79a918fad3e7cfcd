"""A round's metrics: each kind of update's mean figures, what each reward source gave, and
what the sub-rounds and the behaviour relog report (`learner.rounds`)."""

from __future__ import annotations

import math
import resource
import sys
from pathlib import Path


def round_metrics(
    pg: list[dict[str, float]],
    dpo: list[dict[str, float]],
    kto: list[dict[str, float]],
    counts: dict[str, float],
    *parts: dict[str, float],
) -> dict[str, float]:
    """The policy-gradient updates' mean metrics, DPO's and KTO's under their prefixes, the
    number of updates, `counts` (skipped steps, reward sources, ...) and the other `parts`
    (the sub-rounds', the behaviour relog's); NaN ones dropped (undefined this round)."""
    metrics = mean_metrics(pg)
    metrics.update({f"dpo/{k}": v for k, v in mean_metrics(dpo).items()})
    metrics.update({f"kto/{k}": v for k, v in mean_metrics(kto).items()})
    metrics["updates"] = float(len(pg) + len(dpo) + len(kto))
    metrics.update({k: float(v) for k, v in counts.items()})
    for part in parts:
        metrics.update(part)
    return {k: v for k, v in metrics.items() if math.isfinite(v)}


def mean_metrics(runs: list[dict[str, float]]) -> dict[str, float]:
    """Each metric's mean over the updates of a round (NaN-free where possible)."""
    keys = {k for m in runs for k in m}
    out = {}
    for k in sorted(keys):
        values = [m[k] for m in runs if k in m and not math.isnan(m[k])]
        out[k] = sum(values) / len(values) if values else math.nan
    return out


def peak_rss_mb() -> float:
    """This process's peak resident memory so far, in MiB (`memory/peak_rss_mb` of a round:
    a learner that runs rounds one after another reports its high-water mark, the figure a
    machine must have).

    Linux's `VmHWM`, not `getrusage`: Linux keeps `ru_maxrss` across exec, so a learner
    started by a large process would report its parent's peak.
    """
    status = Path("/proc/self/status")
    if status.exists():
        for line in status.read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024  # kB
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux, bytes on macOS
    return peak / (1024 * 1024 if sys.platform == "darwin" else 1024)
