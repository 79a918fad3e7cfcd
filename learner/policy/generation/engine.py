"""Batched generation: one worker thread decodes the rows of one policy together.

A row is one sample (a request with `n` = 3 is three rows). The worker gathers rows for a
few ms, left-pads them into one prefill with their own position ids, then decodes them step
by step on a shared KV cache. Rows that arrive meanwhile join at the next step (their own
prefill, then their cache is merged in), and each row leaves as soon as it finishes. Rows
of another policy (version) wait for the running batch to drain: versions never mix.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from learner.policy.generation.prefix_cache import PrefixCache, cache_from_head, turn_marker
from learner.policy.generation.rows import FinishEvent, Row, SamplingParams, TokenEvent, step

__all__ = ["FinishEvent", "GenerationEngine", "Row", "SamplingParams", "TokenEvent", "eos_ids"]
log = logging.getLogger(__name__)


@dataclass
class _Batch:
    """Rows decoding together: their KV cache, attention mask, last positions and tokens."""

    rows: list[Row]
    cache: DynamicCache
    attn: torch.Tensor  # (B, T) 1 = real token, 0 = left padding
    pos: torch.Tensor  # (B, 1) position of each row's last token
    tokens: torch.Tensor  # (B,) each row's last sampled token


@dataclass
class _Model:
    """What decoding needs of a policy."""

    model: Any
    tokenizer: Any
    eos: set[int]
    device: torch.device
    marker: tuple[int, ...] = ()  # opens a user turn (see prefix_cache.turn_marker)


class GenerationEngine:
    """Owns the worker thread; `submit` rows from any thread, events come back through `emit`."""

    def __init__(
        self,
        max_batch_size: int = 8,
        batch_window_s: float = 0.005,
        on_batch: Callable[[int], None] | None = None,
        prefix_entries: int = 8,
        cache_alone: bool = False,
    ) -> None:
        """`cache_alone`: a row that arrives alone caches its head before its last user turn
        (see `prefix_cache`); off, only rows that arrive together share a cached head."""
        self.max_batch_size = max_batch_size
        self.prefixes = PrefixCache(prefix_entries) if prefix_entries > 0 else None
        self.cache_alone = cache_alone
        self.batch_window_s = batch_window_s
        self.on_batch = on_batch  # called with the row count of every forward pass
        self._pending: list[Row] = []
        self._active: list[Row] = []
        self._cond = threading.Condition()
        self._stopped = False
        self._thread = threading.Thread(target=self._run, name="policy-engine", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        with self._cond:
            self._stopped = True
            self._cond.notify_all()
        self._thread.join(timeout=30)

    def submit(self, rows: Sequence[Row]) -> None:
        with self._cond:
            self._pending.extend(rows)
            self._cond.notify_all()

    def _run(self) -> None:
        while True:
            rows = self._next_batch()
            if rows is None:
                return
            self._active = list(rows)
            try:
                with torch.inference_mode():
                    self._generate(rows)
            except Exception as exc:
                log.exception("generation failed for %d rows", len(self._active))
                for row in self._active:
                    if row.finish_reason is None:
                        row.finish("error", error=f"{type(exc).__name__}: {exc}")

    def _next_batch(self) -> list[Row] | None:
        """The oldest row's policy-mates, after waiting up to the batch window for more."""
        with self._cond:
            while not self._pending and not self._stopped:
                self._cond.wait()
            if self._stopped:
                return None
            first = self._pending[0]
            deadline = first.enqueued_at + self.batch_window_s
            while not self._stopped and self._count(first.policy) < self.max_batch_size:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._cond.wait(left)
            return self._take(first.policy, self.max_batch_size)

    def _joiners(self, policy: Any, room: int) -> list[Row]:
        """Rows of the running policy that may join now; none while another version waits."""
        with self._cond:
            if room <= 0 or any(r.policy is not policy for r in self._pending):
                return []
            return self._take(policy, room)

    def _take(self, policy: Any, limit: int) -> list[Row]:
        taken = [r for r in self._pending if r.policy is policy][:limit]
        chosen = set(map(id, taken))
        self._pending = [r for r in self._pending if id(r) not in chosen]
        return [r for r in taken if not r.cancelled]

    def _count(self, policy: Any) -> int:
        return sum(1 for r in self._pending if r.policy is policy)

    def _generate(self, rows: list[Row]) -> None:
        policy = rows[0].policy if rows else None
        if policy is None:
            return
        m = _Model(policy.model, policy.tokenizer, set(), next(policy.model.parameters()).device)
        m.eos = eos_ids(m.model, m.tokenizer)
        m.marker = turn_marker(m.tokenizer) if self.cache_alone else ()
        joinable = _mergeable(m.model)
        batch = self._prefill(m, rows)
        while batch is not None:
            room = self.max_batch_size - len(batch.rows) if joinable else 0
            joiners = self._joiners(policy, room)
            if joiners:
                self._active += joiners
                batch = _merge(batch, self._prefill(m, joiners))
            batch = self._decode(m, batch)

    def _prefill(self, m: _Model, rows: list[Row]) -> _Batch | None:
        """One forward over the left-padded prompts (after a cached shared head, if any);
        samples each row's first token."""
        for row in rows:
            row.seed_generator(m.device)
        prompts = [r.prompt_ids for r in rows]
        if self.prefixes is not None:
            head, layers = self.prefixes.head(m.model, prompts, m.marker)
        else:
            head, layers = 0, None
        tails = [p[head:] for p in prompts]
        ids, tail_attn = _left_pad(tails, m.tokenizer.pad_token_id, m.device)  # (B, S)
        pos = head + (tail_attn.cumsum(-1) - 1).clamp(min=0)  # (B, S): pads shift no position
        attn = F.pad(tail_attn, (head, 0), value=1)  # (B, head + S)
        if layers is not None:
            cache = cache_from_head(m.model, layers, len(rows))
        else:
            cache = DynamicCache(config=m.model.config)
        self._observe(len(rows))
        out = m.model(
            input_ids=ids,
            attention_mask=attn,
            position_ids=pos,
            cache=cache,
            use_cache=True,
            logits_to_keep=1,
        )
        tokens = step(rows, out.logits[:, -1, :].float(), m.tokenizer, m.eos)  # (B,)
        return _drop_finished(_Batch(rows, cache, attn, pos[:, -1:], tokens))

    def _decode(self, m: _Model, b: _Batch) -> _Batch | None:
        """One token for every row of the batch."""
        attn = torch.cat([b.attn, b.attn.new_ones((len(b.rows), 1))], dim=-1)  # (B, T+1)
        pos = b.pos + 1  # (B, 1)
        self._observe(len(b.rows))
        out = m.model(
            input_ids=b.tokens[:, None],
            attention_mask=attn,
            position_ids=pos,
            cache=b.cache,
            use_cache=True,
        )
        tokens = step(b.rows, out.logits[:, -1, :].float(), m.tokenizer, m.eos)  # (B,)
        return _drop_finished(_Batch(b.rows, b.cache, attn, pos, tokens))

    def _observe(self, rows: int) -> None:
        if self.on_batch:
            self.on_batch(rows)


def _drop_finished(b: _Batch) -> _Batch | None:
    """The batch without finished or cancelled rows (None if none is left)."""
    keep = [i for i, r in enumerate(b.rows) if r.finish_reason is None and not r.cancelled]
    if not keep:
        return None
    if len(keep) < len(b.rows):
        index = torch.tensor(keep, device=b.attn.device)
        b.cache.batch_select_indices(index)
        b = _Batch([b.rows[i] for i in keep], b.cache, b.attn[index], b.pos[index], b.tokens[index])
    return _trim_left(b)


def _trim_left(b: _Batch) -> _Batch:
    """Drop leading columns that are padding in every row (left by rows that finished)."""
    lead = int((b.attn.cumsum(-1) == 0).all(0).sum())
    if lead == 0:
        return b
    for layer in b.cache.layers:
        layer.keys, layer.values = layer.keys[..., lead:, :], layer.values[..., lead:, :]
    return _Batch(b.rows, b.cache, b.attn[:, lead:], b.pos, b.tokens)


def _merge(a: _Batch, b: _Batch | None) -> _Batch:
    """One batch of both: caches and masks left-padded to the same length, stacked."""
    if b is None:
        return a
    T = max(a.attn.shape[1], b.attn.shape[1])
    for la, lb in zip(a.cache.layers, b.cache.layers, strict=True):
        la.keys = torch.cat([_pad_left(la.keys, T), _pad_left(lb.keys, T)])  # (Ba+Bb, H, T, D)
        la.values = torch.cat([_pad_left(la.values, T), _pad_left(lb.values, T)])
    attn = torch.cat(
        [F.pad(a.attn, (T - a.attn.shape[1], 0)), F.pad(b.attn, (T - b.attn.shape[1], 0))]
    )
    return _Batch(
        a.rows + b.rows, a.cache, attn, torch.cat([a.pos, b.pos]), torch.cat([a.tokens, b.tokens])
    )


def _pad_left(x: torch.Tensor, T: int) -> torch.Tensor:
    """(B, H, t, D) -> (B, H, T, D) with zeros in front (masked out by the attention mask)."""
    return F.pad(x, (0, 0, T - x.shape[-2], 0))


def _mergeable(model: Any) -> bool:
    """Joining needs a plain growing cache (not sliding windows or recurrent state)."""
    probe = DynamicCache(config=model.config)
    return all(type(layer) is DynamicLayer for layer in probe.layers)


def _left_pad(prompts: list[list[int]], pad_id: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    T = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), T), pad_id, dtype=torch.long)  # (B, T)
    attn = torch.zeros((len(prompts), T), dtype=torch.long)  # (B, T)
    for i, p in enumerate(prompts):
        ids[i, T - len(p) :] = torch.tensor(p, dtype=torch.long)
        attn[i, T - len(p) :] = 1
    return ids.to(device), attn.to(device)


def eos_ids(model: Any, tokenizer: Any) -> set[int]:
    """The ids that end a row: the model's generation config's eos ids and the tokenizer's."""
    configured = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    ids = set(configured if isinstance(configured, list) else [configured])
    ids.add(tokenizer.eos_token_id)
    return {int(i) for i in ids if i is not None}
