"""The learner's one line per round: version, episodes, reward, KL, loss, time, and what the
sub-rounds, KTO and the reward model did."""

from __future__ import annotations

import math

from learner.rounds import RoundResult


def summary_line(r: RoundResult) -> str:
    """One line per round: version, episodes, reward mean, kl, loss, time."""
    m = r.metrics
    if r.published.champion:
        where = "champion"
    elif r.published.conflict:
        where = "published, NOT champion (alias moved)"
    else:
        where = "ready for the eval gate"
    return (
        f"{r.version} <- {r.parent}  episodes {r.episodes}  samples {r.samples}  pairs {r.pairs}"
        f"  reward {_f(r.reward_mean)}  kl {_f(m.get('kl', math.nan), 4)}"
        f"  loss {_f(m.get('loss', m.get('dpo/loss', math.nan)), 4)}  {r.seconds:.1f}s  {where}"
        + _subround_part(m)
        + _judge_part(m)
    )


def _judge_part(m: dict[str, float]) -> str:
    """KTO answers and the reward model: its held-out AUROC, and whether its scores trained."""
    out = (
        f"  kto {m['reward_sources/kto_judged']:.0f}" if m.get("reward_sources/kto_judged") else ""
    )
    if "reward_model/train_runs" in m:
        used = f"scored {m['reward_sources/reward_model']:.0f} silent runs"
        auroc = m.get("reward_model/auroc", math.nan)  # NaN (dropped): no held-out class pair
        out += f"  reward model AUROC {'n/a' if math.isnan(auroc) else f'{auroc:.2f}'} " + (
            f"({used})" if m.get("reward_model/used") else "(below the bar: not used)"
        )
    return out


def _subround_part(m: dict[str, float]) -> str:
    """The verified sub-rounds' figures: labels, solved rate first -> last, their cost."""
    if not m.get("labels/replayed"):
        return f"  labels {m['labels']:.0f}, none replayed" if m.get("labels") else ""
    return (
        f"  labels {m['labels']:.0f} (replayed {m['labels/replayed']:.0f}): verified "
        f"{m['subround/solved_first']:.0%} -> {m['subround/solved_last']:.0%} "
        f"(generate {m['subround/generate_s']:.0f}s, update {m['subround/update_s']:.0f}s)"
    )


def _f(x: float, digits: int = 3) -> str:
    return "-" if x is None or math.isnan(x) else f"{x:+.{digits}f}"
