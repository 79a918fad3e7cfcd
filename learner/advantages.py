"""Advantages from scalar rewards: leave-one-out, group-relative (GRPO) and a running baseline.

Pure functions: tensors in, tensors out. Production gives one response per prompt, so the
baseline comes from other prompts' samples (RLOO) or from history (running mean); when a
simulator or replay samples a prompt several times, the group itself is the baseline (GRPO).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
from torch import Tensor


def rloo_advantages(rewards: Tensor) -> Tensor:
    """(N,) r_i minus the mean of the other N-1 rewards; all zeros when N < 2.

    Over single samples of different prompts this is the leave-one-out baseline of
    Kool et al. (2019): unbiased, because sample i's own reward is not in its baseline.
    The advantages sum to zero.
    """
    n = rewards.numel()
    if n < 2:
        return torch.zeros_like(rewards)
    others_mean = (rewards.sum() - rewards) / (n - 1)  # (N,)
    return rewards - others_mean


def group_advantages(
    rewards: Tensor, group_ids: Tensor, scale_std: bool = True, eps: float = 1e-4
) -> Tensor:
    """(N,) GRPO advantages: (r - group mean) / (group std + eps), std unbiased as in TRL.

    A group of one, or one whose rewards are all equal, gets zero advantage: nothing
    distinguishes its samples. `group_ids` (N,) holds any integers (e.g. a prompt hash).
    """
    _, inverse = torch.unique(group_ids, return_inverse=True)  # (N,) dense group index
    num_groups = int(inverse.max()) + 1
    r = rewards.to(torch.float64)
    zeros = torch.zeros(num_groups, dtype=r.dtype)
    count = zeros.index_add(0, inverse, torch.ones_like(r))  # (G,)
    mean = zeros.index_add(0, inverse, r) / count  # (G,)
    centred = r - mean[inverse]  # (N,)
    adv = centred
    if scale_std:
        sq = zeros.index_add(0, inverse, centred**2)  # (G,)
        std = torch.sqrt(sq / (count - 1).clamp(min=1))  # (G,) a group of one has std 0
        adv = centred / (std[inverse] + eps)
    return adv.to(rewards.dtype)


@dataclass(frozen=True)
class RunningBaseline:
    """An exponential moving average of rewards across batches: the baseline with no group."""

    mean: float = 0.0
    """Current baseline value."""
    count: int = 0
    """Rewards seen so far; 0 means no history yet."""
    momentum: float = 0.9
    """Weight of the old mean in each update (0.9: roughly the last ten batches count)."""


def running_baseline_advantages(
    rewards: Tensor, state: RunningBaseline
) -> tuple[Tensor, RunningBaseline]:
    """((N,) advantages, new state): rewards minus the baseline *before* this batch.

    The batch is kept out of its own baseline (no self-correlation bias). With no history
    yet (count 0) the batch mean is both the baseline and the new state's mean.
    """
    batch_mean = float(rewards.mean())
    if state.count == 0:
        return rewards - batch_mean, replace(state, mean=batch_mean, count=rewards.numel())
    advantages = rewards - state.mean
    new_mean = state.momentum * state.mean + (1.0 - state.momentum) * batch_mean
    return advantages, replace(state, mean=new_mean, count=state.count + rewards.numel())
