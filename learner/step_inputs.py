"""What an update reads off its samples and pairs (pure): loss masks, micro-batches, the flat
proximal, behaviour and advantage tensors of a micro-batch, and the checks on a step's input."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import TypeVar

import torch

from learner.samples import Judged, PreferencePair, Sample

T = TypeVar("T")


def loss_mask(s: Sample) -> list[int]:
    return s.loss_mask if s.loss_mask is not None else [1] * len(s.completion_ids)


def micro_batches(samples: list[Sample], size: int, tokens: int) -> list[list[Sample]]:
    """Chunks of similar length (longest first): little padding, and the memory peak comes first;
    at most `size` samples and `tokens` padded tokens each (`token_chunks`)."""
    length = lambda s: len(s.prompt_ids) + len(s.completion_ids)  # noqa: E731
    return token_chunks(sorted(samples, key=length, reverse=True), size, tokens, length)


def token_chunks(
    items: Sequence[T], rows: int, tokens: int, length: Callable[[T], int]
) -> list[list[T]]:
    """`items` in order, cut into chunks of at most `rows` items whose padded size (items x the
    longest `length`) is at most `tokens`; an item longer than `tokens` goes alone."""
    out: list[list[T]] = []
    chunk: list[T] = []
    longest = 0
    for item in items:
        n = length(item)
        if chunk and (len(chunk) == rows or max(longest, n) * (len(chunk) + 1) > tokens):
            out.append(chunk)
            chunk, longest = [], 0
        chunk.append(item)
        longest = max(longest, n)
    if chunk:
        out.append(chunk)
    return out


def flat_proximal(chunk: list[Sample], logp: torch.Tensor) -> torch.Tensor:
    """(N,) proximal logprobs of the trained tokens; a sample's first use stores `logp` on it.

    Every micro-batch of a step sees the same weights, so at first use the ratio to the
    proximal is exactly 1; a later step on the same Sample objects clips against it.
    """
    current = logp.detach().tolist()  # (N,) in chunk order: sum(loss_mask) tokens per sample
    values: list[float] = []
    start = 0
    for s in chunk:
        mask = loss_mask(s)
        if s.proximal_logprobs is None:
            taken = iter(current[start : start + sum(mask)])
            s.proximal_logprobs = [next(taken) if m else math.nan for m in mask]
        values += [lp for lp, m in zip(s.proximal_logprobs, mask, strict=True) if m]
        start += sum(mask)
    return torch.tensor(values, dtype=logp.dtype, device=logp.device)


def flat_behaviour(
    chunk: list[Sample], proximal: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """((N,) behaviour logprobs of the trained tokens, (N,) whether each was logged); missing -> proximal."""
    values: list[float] = []
    logged: list[bool] = []
    for s in chunk:
        mask = loss_mask(s)
        if s.behaviour_logprobs is None:
            values += [0.0] * sum(mask)
            logged += [False] * sum(mask)
        else:
            values += [lp for lp, m in zip(s.behaviour_logprobs, mask, strict=True) if m]
            logged += [True] * sum(mask)
    behaviour = torch.tensor(values, dtype=proximal.dtype, device=proximal.device)
    is_logged = torch.tensor(logged, dtype=torch.bool, device=proximal.device)
    return torch.where(is_logged, behaviour, proximal), is_logged


def flat_advantages(chunk: list[Sample], logp: torch.Tensor) -> torch.Tensor:
    adv = torch.tensor([s.advantage for s in chunk], dtype=logp.dtype, device=logp.device)  # (B,)
    counts = torch.tensor([sum(loss_mask(s)) for s in chunk], device=logp.device)  # (B,)
    return torch.repeat_interleave(adv, counts)  # (N,)


def check_samples(samples: list[Sample]) -> None:
    if not samples:
        raise ValueError("step() needs at least one sample")
    for i, s in enumerate(samples):
        where = f"sample {i}"
        if not s.prompt_ids or not s.completion_ids:
            raise ValueError(
                f"{where}: prompt_ids and completion_ids must each hold at least one token"
            )
        if s.loss_mask is not None and (
            len(s.loss_mask) != len(s.completion_ids) or set(s.loss_mask) - {0, 1}
        ):
            raise ValueError(f"{where}: loss_mask needs one 0/1 per completion token")
        check_logprobs(where, "behaviour", s.behaviour_logprobs, loss_mask(s))
        check_logprobs(where, "proximal", s.proximal_logprobs, loss_mask(s))
        if not math.isfinite(s.advantage):
            raise ValueError(f"{where}: advantage {s.advantage} is not finite")


def check_logprobs(where: str, kind: str, values: list[float] | None, mask: list[int]) -> None:
    if values is None:
        return
    if len(values) != len(mask):
        raise ValueError(
            f"{where}: {len(values)} {kind} logprobs for {len(mask)} completion tokens"
        )
    if not all(math.isfinite(x) for x, m in zip(values, mask, strict=True) if m):
        raise ValueError(
            f"{where}: {kind} logprobs must be finite where loss_mask is 1 "
            "(drop the sample or leave them None)"
        )


def check_pairs(pairs: list[PreferencePair]) -> None:
    if not pairs:
        raise ValueError("dpo_step() needs at least one preference pair")
    for i, p in enumerate(pairs):
        if not p.prompt_ids or not p.chosen_ids or not p.rejected_ids:
            raise ValueError(
                f"pair {i}: prompt, chosen and rejected ids must each hold at least one token"
            )


def check_judged(examples: list[Judged]) -> None:
    if len(examples) < 2:
        raise ValueError(
            "kto_step() needs at least two judged answers (KTO's reference point pairs each "
            "answer with another example's prompt)"
        )
    for i, e in enumerate(examples):
        if not e.prompt_ids or not e.completion_ids:
            raise ValueError(f"judged answer {i}: prompt and completion ids must each hold a token")
        if not (math.isfinite(e.weight) and e.weight > 0):
            raise ValueError(f"judged answer {i}: weight {e.weight} must be finite and positive")
