"""Which held-out tasks a gate runs, in which order, and with which sampling seeds (pure).

A gate draws from a pack's large held-out pool: a stratified order (by pack and task kind)
whose every prefix is stratified too, so each look of the sequential test (`sequential`)
sees the kinds in their pool proportions. The draw is seeded by the champion, so every
candidate judged against one champion runs the same tasks (the champion's outcomes are
computed once and cached), and each new champion brings a fresh draw. Sample j of task t
gets the same seed for both versions (coupled sampling: their outcomes correlate, and the
paired difference has less variance).
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Sequence


def _digest(*parts: object) -> int:
    text = "\x1f".join(str(p) for p in parts)
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big")


def draw_seed(champion: str, salt: str = "") -> int:
    """The draw's seed: one per champion (and suite)."""
    return _digest("draw", champion, salt)


def sample_seed(task_id: str, sample: int, draw: int) -> int:
    """The sampling seed of sample `sample` of `task_id`: the same for both versions."""
    return _digest("sample", task_id, sample, draw) % 2**31


def stratified_order(strata: Sequence[str], seed: int, limit: int | None = None) -> list[int]:
    """Indices into `strata` (one stratum name per task): shuffled within each stratum, then
    interleaved so that every prefix holds each stratum in proportion to its pool share
    (largest remainder). The first `limit` indices (all by default)."""
    rng = random.Random(seed)
    groups: dict[str, list[int]] = {}
    for i, name in enumerate(strata):
        groups.setdefault(name, []).append(i)
    for name in sorted(groups):
        rng.shuffle(groups[name])
    total = len(strata)
    want = total if limit is None else min(limit, total)
    taken = dict.fromkeys(groups, 0)
    order: list[int] = []
    while len(order) < want:
        n = len(order) + 1
        # the stratum furthest below its share of the first n tasks goes next (ties: by name)
        name = max(
            (g for g in sorted(groups) if taken[g] < len(groups[g])),
            key=lambda g: n * len(groups[g]) / total - taken[g],
        )
        order.append(groups[name][taken[name]])
        taken[name] += 1
    return order
