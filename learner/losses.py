"""The learner's loss math: decoupled clipped policy gradient, k3 KL, entropy, DPO, KTO.

Pure functions: tensors in, a typed result out; no model, config or I/O here. Advantage
estimators live in `learner.advantages` and are re-exported so callers need one import.
Shapes: B sequences, T token positions, V vocabulary; a flat (N,) of selected tokens works
wherever (B, T) does.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from learner.advantages import (
    RunningBaseline,
    group_advantages,
    rloo_advantages,
    running_baseline_advantages,
)

__all__ = [
    "DPOLoss",
    "KTOLoss",
    "PGLoss",
    "RunningBaseline",
    "clipped_pg_loss",
    "dpo_loss",
    "entropy_from_logits",
    "group_advantages",
    "kl_k3",
    "kto_loss",
    "masked_mean",
    "rloo_advantages",
    "running_baseline_advantages",
]


def masked_mean(x: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """Mean of `x` where `mask` is 1 (over `dim`, or everything); 0 where the mask is empty."""
    mask = mask.to(x.dtype)
    if dim is None:
        return (x * mask).sum() / mask.sum().clamp(min=1.0)
    return (x * mask).sum(dim) / mask.sum(dim).clamp(min=1.0)


def kl_k3(logp: Tensor, ref_logp: Tensor) -> Tensor:
    """Per-token k3 estimate of KL(policy || ref) from sampled tokens: e^d - d - 1, d = ref - logp.

    Schulman's k3 is unbiased, and never negative, unlike the plain log ratio.
    """
    d = ref_logp - logp
    return (torch.expm1(d) - d).clamp(min=0.0)  # expm1 keeps precision for small d


def entropy_from_logits(logits: Tensor) -> Tensor:
    """(...,) entropy of softmax(logits) over the last dimension, from (..., V) logits."""
    lse = torch.logsumexp(logits, dim=-1)  # (...)
    return lse - (torch.softmax(logits, dim=-1) * logits).sum(-1)


@dataclass
class PGLoss:
    """The clipped policy-gradient loss and its diagnostics (all but `loss` detached)."""

    loss: Tensor
    """Scalar to backpropagate: policy term + kl_coef * KL - entropy_coef * entropy."""
    pg_loss: Tensor
    """The clipped policy term alone."""
    kl: Tensor
    """Mean per-token k3 KL to the reference; 0 when no reference was given."""
    clip_ratio: Tensor
    """Fraction of tokens whose gradient the clip removed (ratio to the proximal outside 1 ± eps
    on the side the advantage pushes)."""
    ratio_mean: Tensor
    """Mean ratio policy / proximal: how far this trainer has moved since it first used the tokens."""
    behaviour_ratio_mean: Tensor
    """Mean ratio policy / behaviour: how far the policy is from the one that wrote the tokens."""
    is_weight_mean: Tensor
    """Mean importance weight min(proximal / behaviour, is_cap) that scaled the advantages."""
    is_truncated: Tensor
    """Fraction of tokens whose importance weight was cut to is_cap."""
    entropy: Tensor
    """Mean per-token entropy; 0 when no entropy was given."""
    num_tokens: Tensor
    """Tokens in the mask: the weight of this batch's means when combining micro-batches."""


def clipped_pg_loss(
    logp: Tensor,
    behaviour_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    proximal_logp: Tensor | None = None,
    is_cap: float = 2.0,
    ref_logp: Tensor | None = None,
    clip_eps: float = 0.2,
    kl_coef: float = 0.0,
    entropy: Tensor | None = None,
    entropy_coef: float = 0.0,
    normalizer: float | Tensor | None = None,
) -> PGLoss:
    """Decoupled PPO (Hilton et al., 2021): clipped against the proximal policy, weighted to the behaviour.

    Clipping against the logged behaviour policy would freeze a stale token for the whole round
    once its ratio passes 1 + eps; here the trust region is around the proximal policy (the
    weights that first trained on the token), and the staleness of the behaviour policy is
    corrected by a truncated, detached importance weight w = min(exp(proximal - behaviour), is_cap).

    logp, behaviour_logp, proximal_logp, mask, ref_logp, entropy: (B, T); advantages: (B,) per
    sequence or (B, T) per token. Per token: -w * min(r A, clip(r, 1-eps, 1+eps) A) with
    r = exp(logp - proximal), plus kl_coef * k3, minus entropy_coef * entropy; summed over the
    mask and divided by `normalizer` (default: the mask's token count; under gradient
    accumulation pass the whole batch's count so micro-batches add up to one token mean, TRL's
    "dapo" normalisation). proximal_logp None: proximal = behaviour, w = 1 (plain PPO).
    """
    behaviour_logp = behaviour_logp.detach()  # the logged policy is data, never trained
    proximal_logp = behaviour_logp if proximal_logp is None else proximal_logp.detach()
    mask = mask.to(logp.dtype)
    adv = (
        advantages.unsqueeze(-1) if advantages.dim() < logp.dim() else advantages
    )  # (B, 1) or (B, T)
    raw_weight = torch.exp(proximal_logp - behaviour_logp)  # (B, T)
    weight = raw_weight.clamp(max=is_cap)  # (B, T)
    ratio = torch.exp(logp - proximal_logp)  # (B, T)
    clipped_ratio = torch.clamp(ratio, 1.0 - clip_eps, 1.0 + clip_eps)  # (B, T)
    pg_per_token = -weight * torch.min(ratio * adv, clipped_ratio * adv)  # (B, T)
    per_token = pg_per_token
    kl = torch.zeros_like(logp) if ref_logp is None else kl_k3(logp, ref_logp.detach())  # (B, T)
    if kl_coef:
        per_token = per_token + kl_coef * kl
    if entropy is not None and entropy_coef:
        per_token = per_token - entropy_coef * entropy
    count = mask.sum()
    loss = (per_token * mask).sum() / (count.clamp(min=1.0) if normalizer is None else normalizer)
    with torch.no_grad():
        # the clip removed the gradient: ratio beyond the side the advantage pushes towards
        low = (ratio < 1.0 - clip_eps) & (adv < 0)  # (B, T)
        high = (ratio > 1.0 + clip_eps) & (adv > 0)  # (B, T)
        is_clipped = low | high
        return PGLoss(
            loss=loss,
            pg_loss=masked_mean(pg_per_token, mask),
            kl=masked_mean(kl, mask),
            clip_ratio=masked_mean(is_clipped.to(logp.dtype), mask),
            ratio_mean=masked_mean(ratio, mask),
            behaviour_ratio_mean=masked_mean(torch.exp(logp - behaviour_logp), mask),
            is_weight_mean=masked_mean(weight, mask),
            is_truncated=masked_mean((raw_weight > is_cap).to(logp.dtype), mask),
            entropy=torch.zeros(()) if entropy is None else masked_mean(entropy.detach(), mask),
            num_tokens=count,
        )


@dataclass
class DPOLoss:
    """The DPO loss and its implicit rewards (all but `loss` detached)."""

    loss: Tensor
    """Scalar: mean of -log sigmoid(beta * (policy margin - reference margin))."""
    chosen_reward: Tensor
    """(B,) beta * (log pi(chosen) - log ref(chosen))."""
    rejected_reward: Tensor
    """(B,) beta * (log pi(rejected) - log ref(rejected))."""
    reward_margin: Tensor
    """Mean of chosen_reward - rejected_reward."""
    accuracy: Tensor
    """Fraction of pairs whose chosen reward beats the rejected one."""


def dpo_loss(
    chosen_logp: Tensor,
    rejected_logp: Tensor,
    ref_chosen_logp: Tensor,
    ref_rejected_logp: Tensor,
    beta: float = 0.1,
) -> DPOLoss:
    """Direct Preference Optimisation (Rafailov et al., 2023) on (B,) sequence-level log-prob sums."""
    chosen_reward = beta * (chosen_logp - ref_chosen_logp.detach())  # (B,)
    rejected_reward = beta * (rejected_logp - ref_rejected_logp.detach())  # (B,)
    margin = chosen_reward - rejected_reward  # (B,)
    loss = -F.logsigmoid(margin).mean()
    margin = margin.detach()
    return DPOLoss(
        loss=loss,
        chosen_reward=chosen_reward.detach(),
        rejected_reward=rejected_reward.detach(),
        reward_margin=margin.mean(),
        accuracy=(margin > 0).to(margin.dtype).mean(),
    )


@dataclass
class KTOLoss:
    """The KTO loss, per answer and averaged, with its reference point (all but the losses detached)."""

    loss: Tensor
    """Scalar: the weighted per-answer losses' mean."""
    losses: Tensor
    """(B,) weight * per-answer loss, with gradient (sum these over micro-batches)."""
    kl: Tensor
    """The reference point z0 = max(0, mean KL estimate over mismatched pairs)."""
    rewards: Tensor
    """(B,) implied rewards beta * (log pi(y|x) - log ref(y|x))."""


def kto_reference_point(kl_logp: Tensor, ref_kl_logp: Tensor) -> Tensor:
    """KTO's z0: the mean of log pi - log ref over (B,) mismatched (prompt, completion) pairs,
    clamped at 0 and detached (TRL's estimate of KL(pi || ref))."""
    return (kl_logp - ref_kl_logp).mean().detach().clamp(min=0.0)


def kto_loss(
    logp: Tensor,
    ref_logp: Tensor,
    desirable: Tensor,
    kl: Tensor,
    *,
    beta: float = 0.1,
    weights: Tensor | None = None,
) -> KTOLoss:
    """Kahneman-Tversky Optimisation (Ethayarajh et al., 2024) on (B,) sequence log-prob sums.

    With r = log pi(y|x) - log ref(y|x) and the reference point z0 = `kl`
    (`kto_reference_point`), a desirable answer costs 1 - sigmoid(beta (r - z0)), an
    undesirable one 1 - sigmoid(beta (z0 - r)); each is multiplied by its weight (TRL's
    desirable_weight / undesirable_weight, or a per-answer weight) and the batch averaged.
    desirable: (B,) bool.
    """
    r = logp - ref_logp.detach()  # (B,)
    sign = torch.where(desirable, 1.0, -1.0).to(r.dtype)  # (B,)
    per = 1.0 - torch.sigmoid(beta * sign * (r - kl.detach()))  # (B,)
    if weights is not None:
        per = per * weights.to(per.dtype)
    return KTOLoss(loss=per.mean(), losses=per, kl=kl.detach(), rewards=(beta * r).detach())
