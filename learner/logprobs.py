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


MIN_SHARED_PREFIX = 16
"""Fewest head tokens worth a separate forward pass (the prefix shared by a batch's rows)."""


def completion_log_softmax(model: torch.nn.Module, batch: TokenBatch) -> torch.Tensor:
    """(N, V) log-softmax at the N positions where `completion_mask` is 1, row by row.

    The LM head (a 49k x 576 matrix for SmolLM2, a fifth of the forward) runs only on those
    positions, through transformers' boolean `logits_to_keep`: no logits for prompt, masked or
    padding tokens. Models without that argument fall back to full logits, then selection.

    Rows that open with the same tokens (an agent's system prompt and worked example: most of
    each prompt) share them: the head runs once, as one row, and its keys and values are
    repeated for every row's remainder. The same function of the weights, gradient included
    (autograd sums each row's share into the head), at a fraction of the compute; values agree
    with the unshared pass to float rounding.
    """
    keep = batch.completion_mask > 0  # (B, T-1): position t predicts token t+1
    if _accepts_logits_to_keep(model):
        # (B, T): the last position predicts nothing
        positions = torch.nn.functional.pad(keep, (0, 1))
        head = shared_prefix(batch, keep) if _can_share(model) else 0
        if head >= MIN_SHARED_PREFIX:
            name = _cache_argument(model)  # `cache` (transformers 5.x) or `past_key_values`
            # through a DDP wrapper only once (its gradient hooks expect one forward per
            # backward): the head runs on the wrapped module, its gradient flows all the same
            cache = getattr(
                _unwrapped(model)(
                    input_ids=batch.input_ids[:1, :head],
                    attention_mask=batch.attention_mask[:1, :head],
                    logits_to_keep=1,  # no logits wanted from the head: the fewest it computes
                    use_cache=True,
                ),
                name,
            )
            cache.batch_repeat_interleave(batch.input_ids.shape[0])
            out = model(
                input_ids=batch.input_ids[:, head:],
                attention_mask=batch.attention_mask,
                logits_to_keep=positions[:, head:],
                use_cache=True,
                **{name: cache},
            )
        else:
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


def last_logits_only(model: torch.nn.Module) -> dict[str, int]:
    """Keyword arguments that keep a forward pass's LM head to the last position, for passes
    that want hidden states, not logits (full logits of 8 rows of 800 tokens are 1.3 GB in
    fp32 for SmolLM2's 49k vocabulary); {} for a model without `logits_to_keep`."""
    return {"logits_to_keep": 1} if _forward_takes(type(_inner(model)), "logits_to_keep") else {}


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


def shared_prefix(batch: TokenBatch, keep: torch.Tensor) -> int:
    """How many head tokens every row has alike (real tokens, the same ids) before the first
    position any row needs logits at; 0 for a single row."""
    ids, attn = batch.input_ids, batch.attention_mask  # (B, T)
    if ids.shape[0] < 2:
        return 0
    same = ((ids == ids[:1]).all(0) & (attn > 0).all(0)).long()  # (T,)
    head = int(same.cumprod(0).sum())
    wanted = keep.any(0).nonzero()  # positions some row needs logits at
    return min(head, int(wanted[0])) if len(wanted) else 0


def _can_share(model: torch.nn.Module) -> bool:
    """A key/value cache can carry the shared head: not under gradient checkpointing, which
    turns the cache off while training."""
    inner = _inner(model)
    name = next(
        (
            n
            for n in ("is_activation_checkpointing", "is_gradient_checkpointing")
            if hasattr(type(inner), n)
        ),
        None,
    )
    return not (name and getattr(inner, name) and torch.is_grad_enabled())


def _unwrapped(model: torch.nn.Module) -> torch.nn.Module:
    """The module under DDP / accelerate wrappers (peft kept)."""
    while hasattr(model, "module"):
        model = model.module
    return model


def _cache_argument(model: torch.nn.Module) -> str:
    return "cache" if _forward_takes(type(_inner(model)), "cache") else "past_key_values"


def _inner(model: torch.nn.Module) -> torch.nn.Module:
    """The transformers model under DDP / accelerate wrappers and peft."""
    inner = _unwrapped(model)
    return inner.get_base_model() if hasattr(inner, "get_base_model") else inner


def _accepts_logits_to_keep(model: torch.nn.Module) -> bool:
    import transformers.modeling_utils as mu

    if not hasattr(mu, "slice_logits_to_keep"):  # older transformers: no boolean (B, T) selection
        return False
    return _forward_takes(type(_inner(model)), "logits_to_keep")  # peft passes it through


@functools.cache
def _forward_takes(cls: type, name: str) -> bool:
    return name in inspect.signature(cls.forward).parameters
