"""Figures the gate computes with the models themselves, on logged token ids (never re-tokenised).

`divergence`: exact per-token KL(candidate || reference) over the whole vocabulary, and both
policies' token entropies, on the candidate's own eval completions. `token_logprobs`: each
logged completion's per-token log-probabilities under a model (for importance weights).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from learner.logprobs import TokenBatch, _accepts_logits_to_keep, make_batch

Tokens = tuple[Sequence[int], Sequence[int]]  # (prompt ids, completion ids)


@dataclass(frozen=True)
class Divergence:
    """Means over every completion token of the sequences compared."""

    kl: float  # KL(candidate || reference), nats per token
    candidate_entropy: float
    reference_entropy: float
    tokens: int


def divergence(
    candidate: torch.nn.Module,
    reference: torch.nn.Module,
    sequences: Sequence[Tokens],
    pad_id: int,
    micro_batch: int = 4,
) -> Divergence | None:
    """KL and entropies on the completion tokens; None when there is no token to compare."""
    sums = torch.zeros(3, dtype=torch.float64)  # kl, H(candidate), H(reference)
    count = 0
    for chunk in _chunks([s for s in sequences if len(s[0]) and len(s[1])], micro_batch):
        batch = make_batch([p for p, _ in chunk], [c for _, c in chunk], pad_id)
        with torch.no_grad():
            lp_c = _completion_log_probs(candidate, batch)  # (N, V)
            lp_r = _completion_log_probs(reference, batch)  # (N, V)
        p_c = lp_c.exp()  # (N, V)
        sums[0] += float((p_c * (lp_c - lp_r)).sum())
        sums[1] += float(-(p_c * lp_c).sum())
        sums[2] += float(-(lp_r.exp() * lp_r).sum())
        count += lp_c.shape[0]
    if count == 0:
        return None
    kl, h_c, h_r = (sums / count).tolist()
    return Divergence(max(kl, 0.0), h_c, h_r, count)


def token_logprobs(
    model: torch.nn.Module, sequences: Sequence[Tokens], pad_id: int, micro_batch: int = 8
) -> list[torch.Tensor]:
    """Per sequence, the (C,) log-probabilities of its completion tokens under `model`."""
    out: list[torch.Tensor] = []
    for chunk in _chunks(list(sequences), micro_batch):
        batch = make_batch([p for p, _ in chunk], [c for _, c in chunk], pad_id)
        with torch.no_grad():
            lp = _completion_log_probs(model, batch)  # (N, V)
        targets = batch.input_ids[:, 1:][batch.completion_mask > 0]  # (N,)
        picked = lp.gather(-1, targets.unsqueeze(-1)).squeeze(-1)  # (N,)
        out += list(picked.split([len(c) for _, c in chunk]))
    return out


def _completion_log_probs(model: torch.nn.Module, batch: TokenBatch) -> torch.Tensor:
    """(N, V) log-softmax at the N completion positions; the LM head runs only there."""
    keep = batch.completion_mask > 0  # (B, T-1): position t predicts token t+1
    if _accepts_logits_to_keep(model):
        positions = torch.nn.functional.pad(keep, (0, 1))  # (B, T): the last predicts nothing
        out = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask,
                    logits_to_keep=positions, use_cache=False)  # fmt: skip
        logits = out.logits.float()  # (N, V)
    else:
        out = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask, use_cache=False)
        logits = out.logits[:, :-1][keep].float()  # (N, V)
    return torch.log_softmax(logits, dim=-1)


def _chunks(items: list, size: int) -> list[list]:
    return [items[i : i + size] for i in range(0, len(items), max(1, size))]
