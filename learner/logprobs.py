"""Per-token log-probabilities of logged completions under a model: the learner's view of a policy."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Sequence
from dataclasses import dataclass

import torch


@dataclass
class TokenBatch:
    """Prompt+completion sequences, right-padded, with a mask over the completion tokens."""

    input_ids: torch.Tensor  # (B, T)
    attention_mask: torch.Tensor  # (B, T)
    completion_mask: torch.Tensor  # (B, T-1) float: 1 where target token t+1 is a completion token


def make_batch(
    prompts: Sequence[Sequence[int]],
    completions: Sequence[Sequence[int]],
    pad_id: int,
    loss_masks: Sequence[Sequence[int]] | None = None,
) -> TokenBatch:
    """Concatenate each prompt with its completion and pad on the right.

    `loss_masks`, one 0/1 per completion token, removes tokens (e.g. tool output spliced into
    a completion) from the completion mask; by default every completion token counts.
    """
    lengths = [len(p) + len(c) for p, c in zip(prompts, completions, strict=True)]
    T = max(lengths)
    B = len(lengths)
    ids = torch.full((B, T), pad_id, dtype=torch.long)
    attn = torch.zeros((B, T), dtype=torch.long)
    cmask = torch.zeros((B, T), dtype=torch.float32)
    for i, (p, c) in enumerate(zip(prompts, completions, strict=True)):
        ids[i, : len(p) + len(c)] = torch.tensor(list(p) + list(c), dtype=torch.long)
        attn[i, : len(p) + len(c)] = 1
        m = loss_masks[i] if loss_masks is not None else [1] * len(c)
        cmask[i, len(p) : len(p) + len(c)] = torch.tensor(m, dtype=torch.float32)
    return TokenBatch(ids, attn, cmask[:, 1:])


def token_logprobs(
    model: torch.nn.Module,
    batch: TokenBatch,
    *,
    temperature: float = 1.0,
    with_entropy: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(logprobs, entropy), each (B, T-1): log p(x_{t+1} | x_{<=t}) and the entropy at t.

    Positions outside the completion hold values the caller must mask with `completion_mask`.
    """
    out = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask, use_cache=False)
    logits = out.logits[:, :-1, :].float()  # (B, T-1, V)
    if temperature != 1.0:
        logits = logits / temperature
    targets = batch.input_ids[:, 1:].unsqueeze(-1)  # (B, T-1, 1)
    lse = torch.logsumexp(logits, dim=-1)  # (B, T-1)
    logp = logits.gather(-1, targets).squeeze(-1) - lse  # (B, T-1)
    entropy = None
    if with_entropy:
        probs = torch.softmax(logits, dim=-1)  # (B, T-1, V)
        entropy = lse - (probs * logits).sum(-1)  # (B, T-1)
    return logp, entropy


def completion_logprobs(
    model: torch.nn.Module, prompt_ids: Sequence[int], completion_ids: Sequence[int], pad_id: int
) -> torch.Tensor:
    """(C,) log-probabilities of one completion's tokens given its prompt, no gradient."""
    batch = make_batch([prompt_ids], [completion_ids], pad_id)
    with torch.no_grad():
        logp, _ = token_logprobs(model, batch)
    start = len(prompt_ids) - 1
    return logp[0, start : start + len(completion_ids)]


def completion_log_softmax(model: torch.nn.Module, batch: TokenBatch) -> torch.Tensor:
    """(N, V) log-softmax at the N positions where `completion_mask` is 1, row by row.

    The LM head (a 49k x 576 matrix for SmolLM2, a fifth of the forward) runs only on those
    positions, through transformers' boolean `logits_to_keep`: no logits for prompt, masked or
    padding tokens. Models without that argument fall back to full logits, then selection.
    """
    keep = batch.completion_mask > 0  # (B, T-1): position t predicts token t+1
    if _accepts_logits_to_keep(model):
        # (B, T): the last position predicts nothing
        positions = torch.nn.functional.pad(keep, (0, 1))
        out = model(
            input_ids=batch.input_ids,
            attention_mask=batch.attention_mask,
            logits_to_keep=positions,
            use_cache=False,
        )
        logits = out.logits.float()  # (N, V)
    else:
        out = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask, use_cache=False)
        logits = out.logits[:, :-1, :][keep].float()  # (N, V)
    # one fused kernel, where logsumexp + gather take several passes over (N, V)
    return torch.log_softmax(logits, dim=-1)


def selected_logprobs(
    model: torch.nn.Module,
    batch: TokenBatch,
    *,
    with_entropy: bool = False,
    entropy_grad: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(logprobs, entropy), each (N,): only the N tokens where `completion_mask` is 1, row by row."""
    targets = batch.input_ids[:, 1:][batch.completion_mask > 0]  # (N,)
    log_probs = completion_log_softmax(model, batch)  # (N, V)
    logp = log_probs.gather(-1, targets.unsqueeze(-1)).squeeze(-1)  # (N,)
    entropy = None
    if with_entropy:
        with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
            entropy = -(log_probs.exp() * log_probs).sum(-1)  # (N,)
    return logp, entropy


def _accepts_logits_to_keep(model: torch.nn.Module) -> bool:
    import transformers.modeling_utils as mu

    if not hasattr(mu, "slice_logits_to_keep"):  # older transformers: no boolean (B, T) selection
        return False
    inner = model
    while hasattr(inner, "module"):  # DDP / accelerate wrappers
        inner = inner.module
    if hasattr(inner, "get_base_model"):  # peft passes the argument through to the base model
        inner = inner.get_base_model()
    return _forward_takes(type(inner), "logits_to_keep")


@functools.cache
def _forward_takes(cls: type, name: str) -> bool:
    return name in inspect.signature(cls.forward).parameters
