"""Prompt-prefix KV reuse: the system prompt and worked example are computed once per policy.

Agent prompts share a long head (system prompt, tool description, worked example) and differ
only in the conversation after it. On a CPU the prompt's forward pass costs far more than
decoding, so the engine keeps the KV of recent shared heads per policy and prefills only
each row's tail. Rows that arrive together share the head they have in common; a row alone
(one user at a time, the usual case on a laptop) caches what comes before its last user turn
(`turn_marker`): the next call of the same run, and every run of the same agent, start with it. Rows then hold [head][padding][tail] in the cache, the padding masked out
and positions counted without it, so a row sees exactly what a plain prefill computes.
"""

from __future__ import annotations

import weakref
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

import torch
from transformers import DynamicCache

MIN_PREFIX = 32  # tokens: a shorter shared head is not worth a cache entry


def common_prefix_len(prompts: Sequence[Sequence[int]]) -> int:
    """Length of the longest head all prompts share, leaving each at least one own token."""
    shortest = min(len(p) for p in prompts)
    first = prompts[0]
    for i in range(shortest - 1):
        if any(p[i] != first[i] for p in prompts):
            return i
    return max(0, shortest - 1)


class PrefixCache:
    """Per-policy KV of shared prompt heads, least recently used evicted first."""

    def __init__(self, max_entries: int = 8) -> None:
        self.max_entries = max_entries
        # (id of the model, head token ids) -> (weakref to the model, [(keys, values)] per layer)
        self._entries: OrderedDict[tuple[int, tuple[int, ...]], tuple[Any, list]] = OrderedDict()
        self.hits = 0
        self.misses = 0

    def head(
        self, model: Any, prompts: Sequence[Sequence[int]], marker: Sequence[int] = ()
    ) -> tuple[int, list | None]:
        """(head length, per-layer (keys, values) of batch 1) to reuse for these prompts, or
        (0, None). `marker`: the tokens that open a user turn (a row alone caches up to its
        last one; empty: a row alone caches nothing)."""
        shared = common_prefix_len(prompts)
        if shared < MIN_PREFIX:
            return 0, None
        found = self._longest(model, prompts[0], shared)
        if found is not None:
            self.hits += 1
            return found
        if len(prompts) < 2:
            shared = last_turn_start(prompts[0], marker)  # one row: its head before the turn
            if shared < MIN_PREFIX:
                return 0, None
        self.misses += 1
        key = (id(model), tuple(prompts[0][:shared]))
        layers = _head_kv(model, prompts[0][:shared])
        self._entries[key] = (weakref.ref(model), layers)
        while len(self._entries) > self.max_entries:
            self._entries.popitem(last=False)
        return shared, layers

    def _longest(self, model: Any, prompt: Sequence[int], shared: int) -> tuple[int, list] | None:
        best = None
        for key, (ref, layers) in list(self._entries.items()):
            if ref() is None:  # the policy was unloaded
                del self._entries[key]
                continue
            mid, head = key
            if mid == id(model) and ref() is model and len(head) <= shared:
                if tuple(prompt[: len(head)]) == head and (best is None or len(head) > best[0]):
                    best = (len(head), layers, key)
        if best is None:
            return None
        self._entries.move_to_end(best[2])
        return best[0], best[1]


def turn_marker(tokenizer: Any) -> tuple[int, ...]:
    """The token ids opening a user turn in a ChatML template (empty for other templates)."""
    start = tokenizer.convert_tokens_to_ids("<|im_start|>")
    if start is None or start == tokenizer.unk_token_id:
        return ()
    return (start, *tokenizer.encode("user", add_special_tokens=False))


def last_turn_start(prompt: Sequence[int], marker: Sequence[int]) -> int:
    """Where the last `marker` in `prompt` starts (0 when there is none)."""
    n = len(marker)
    if not n:
        return 0
    for i in range(len(prompt) - n, -1, -1):
        if tuple(prompt[i : i + n]) == tuple(marker):
            return i
    return 0


def _head_kv(model: Any, head: Sequence[int]) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Each layer's (keys, values) for `head`, batch 1: (1, H, P, D)."""
    device = next(model.parameters()).device
    cache = DynamicCache(config=model.config)
    ids = torch.tensor([list(head)], dtype=torch.long, device=device)  # (1, P)
    model(input_ids=ids, cache=cache, use_cache=True, logits_to_keep=1)
    return [(layer.keys, layer.values) for layer in cache.layers]


def cache_from_head(model: Any, layers: list, rows: int) -> DynamicCache:
    """A batch cache holding the head for `rows` rows (views: decoding concatenates anyway)."""
    cache = DynamicCache(config=model.config)
    for i, (k, v) in enumerate(layers):
        cache.update(k.expand(rows, -1, -1, -1), v.expand(rows, -1, -1, -1), i)
    return cache
