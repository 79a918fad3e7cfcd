"""Figures the gate computes with the models themselves, on logged token ids (never re-tokenised).

`divergence`: exact per-token KL(candidate || reference) over the whole vocabulary, and both
policies' token entropies, on the candidate's own eval completions. `token_logprobs`: each
logged completion's per-token log-probabilities under a model (for importance weights).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from learner.logprobs import completion_log_softmax, make_batch, selected_logprobs

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
            lp_c = completion_log_softmax(candidate, batch)  # (N, V)
            lp_r = completion_log_softmax(reference, batch)  # (N, V)
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
            picked, _ = selected_logprobs(model, batch)  # (N,)
        out += list(picked.split([len(c) for _, c in chunk]))
    return out


def _chunks(items: list, size: int) -> list[list]:
    return [items[i : i + size] for i in range(0, len(items), max(1, size))]
