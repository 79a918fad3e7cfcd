"""A round's metrics: each kind of update's mean figures, what each reward source gave, and
what the sub-rounds and the behaviour relog report (`learner.rounds`)."""

from __future__ import annotations

import math
import resource
import sys
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from learner.episodes import Episode
    from learner.rewards import EpisodeReward


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


def node_metrics(episodes: Sequence[Episode], rewards: Sequence[EpisodeReward]) -> dict[str, float]:
    """Per graph node that made calls (`ModelStep.node`: a team's LangGraph agent that opted in,
    `agents.graph_nodes`): the round's rewarded calls it made (`nodes/<node>/calls`) and their
    mean reward (`nodes/<node>/reward`); {} when no call named its node."""
    by_node: dict[str, list[float]] = defaultdict(list)
    for episode, reward in zip(episodes, rewards, strict=True):
        for step in episode.trajectory.model_steps:
            if step.node and step.index in reward.turns:
                by_node[step.node].append(reward.turns[step.index])
    out = {}
    for node, values in sorted(by_node.items()):
        out[f"nodes/{node}/calls"] = float(len(values))
        out[f"nodes/{node}/reward"] = sum(values) / len(values)
    return out


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
