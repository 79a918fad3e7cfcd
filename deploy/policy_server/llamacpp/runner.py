"""One GGUF file in llama.cpp: the model, one context of parallel sequences, and its slots.

A slot is one of the context's sequences. It keeps the KV of what it last held after its row
finishes, so the next row whose prompt starts the same way (the system prompt and worked
example every agent call shares) prefills only the rest, as llama.cpp's own server does. When
another slot, busy or not, holds a longer head of the prompt (the other samples of one eval
task, an agent's next call after a tool), the claimed slot gets a copy of that slot's KV
instead: copying a sequence (about 15 ms for SmolLM2's 4096 tokens) is cheaper than
prefilling a few dozen tokens (about 3 ms each on 2 cores).
Calls go through llama.cpp's C API (ctypes releases the GIL while it computes).
"""

from __future__ import annotations

import ctypes
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import llama_cpp
import numpy as np

logging.getLogger("llama-cpp-python").setLevel(logging.ERROR)  # its C log lines, on stderr
llama_cpp.llama_backend_init()


class LlamaError(RuntimeError):
    """llama.cpp refused a file or a batch; the message says which and why."""


@dataclass
class Feed:
    """Tokens to append to one slot's sequence; logits are wanted after the last one."""

    slot: int
    tokens: Sequence[int]


class LlamaRunner:
    """A loaded GGUF: `slots` sequences of up to `context` tokens each, decoded together."""

    def __init__(
        self,
        path: Path,
        *,
        slots: int,
        context: int,
        threads: int,
        n_batch: int = 2048,
        copy_gain: int = 16,
    ) -> None:
        """`copy_gain`: the fewest prompt tokens a copy of another slot's KV must save."""
        self.copy_gain = copy_gain
        self.path, self.closed = path, True  # nothing to free until fully made
        params = llama_cpp.llama_model_default_params()
        # No repacked/AMX weight buffers: a build with AMX crashes in sandboxes that do not
        # grant the tile registers, and for Q8_0 they were no faster here (README).
        params.use_extra_bufts = False
        self._model = llama_cpp.llama_model_load_from_file(str(path).encode(), params)
        if not self._model:
            raise LlamaError(f"llama.cpp could not load {path}")
        self._vocab = llama_cpp.llama_model_get_vocab(self._model)
        self.n_vocab = llama_cpp.llama_vocab_n_tokens(self._vocab)
        self.context_train = llama_cpp.llama_model_n_ctx_train(self._model)
        context = min(context, self.context_train)
        self.n_batch = n_batch  # tokens per llama_decode call (longer feeds are split)
        cparams = llama_cpp.llama_context_default_params()
        cparams.n_ctx = context * slots
        cparams.n_batch, cparams.n_ubatch = n_batch, min(n_batch, 512)
        cparams.n_seq_max = slots
        cparams.n_threads = cparams.n_threads_batch = threads
        cparams.no_perf = True
        self._ctx = llama_cpp.llama_init_from_model(self._model, cparams)
        if not self._ctx:
            llama_cpp.llama_model_free(self._model)
            raise LlamaError(f"llama.cpp could not make a context of {slots} x {context} tokens")
        self._memory = llama_cpp.llama_get_memory(self._ctx)
        self.context = llama_cpp.llama_n_ctx_seq(self._ctx)
        self._batch = llama_cpp.llama_batch_init(self.n_batch, 0, 1)
        self.closed = False
        self.held: list[list[int]] = [[] for _ in range(slots)]  # what each slot's KV holds
        self.eos: set[int] = set()  # ids that end a row (the loader sets the model's)

    @property
    def slots(self) -> int:
        return len(self.held)

    def claim(
        self, free: Sequence[int], prompt: Sequence[int], donors: Sequence[int] = ()
    ) -> tuple[int, int]:
        """(slot, tokens kept) for `prompt`: the free slot sharing its longest head, cut there;
        or, when one of `donors` (slots whose KV is what `held` says: not claimed in this step)
        holds `copy_gain` more tokens of it, a free slot given a copy of that slot's KV.

        At least the prompt's last token is fed again: its logits are the first sample's.
        """
        common = {s: _common(self.held[s], prompt) for s in {*free, *donors}}  # each slot once
        slot = max(free, key=common.__getitem__)
        donor = max(donors, key=common.__getitem__, default=slot)
        keep = common[slot]
        if donor != slot and common[donor] - keep >= self.copy_gain:
            llama_cpp.llama_memory_seq_rm(self._memory, slot, -1, -1)
            llama_cpp.llama_memory_seq_cp(self._memory, donor, slot, -1, -1)
            self.held[slot] = list(self.held[donor])
            keep = common[donor]
        keep = min(keep, len(prompt) - 1)
        if not llama_cpp.llama_memory_seq_rm(self._memory, slot, keep, -1):
            llama_cpp.llama_memory_seq_rm(self._memory, slot, -1, -1)
            keep = 0
        del self.held[slot][keep:]
        return slot, keep

    def decode(self, feeds: Sequence[Feed]) -> np.ndarray:
        """Append each feed's tokens to its slot; (len(feeds), n_vocab) logits after each."""
        entries = [  # (slot, position, token, 1 + the feed's row in `logits`, or 0: no logits)
            (f.slot, len(self.held[f.slot]) + i, t, k + 1 if i == len(f.tokens) - 1 else 0)
            for k, f in enumerate(feeds)
            for i, t in enumerate(f.tokens)
        ]
        logits = np.empty((len(feeds), self.n_vocab), dtype=np.float32)  # (B, V)
        for start in range(0, len(entries), self.n_batch):
            self._decode_chunk(entries[start : start + self.n_batch], logits)
        for f in feeds:
            self.held[f.slot].extend(f.tokens)
        return logits

    def _decode_chunk(self, entries: list[tuple[int, int, int, int]], logits: np.ndarray) -> None:
        b = self._batch
        b.n_tokens = len(entries)
        for j, (slot, pos, token, out) in enumerate(entries):
            b.token[j], b.pos[j], b.n_seq_id[j] = token, pos, 1
            b.seq_id[j][0] = slot
            b.logits[j] = 1 if out else 0
        status = llama_cpp.llama_decode(self._ctx, b)
        if status != 0:
            raise LlamaError(f"llama_decode failed with status {status} on {len(entries)} tokens")
        for j, (_, _, _, out) in enumerate(entries):
            if out:
                row = llama_cpp.llama_get_logits_ith(self._ctx, j)
                logits[out - 1] = np.ctypeslib.as_array(
                    ctypes.cast(row, ctypes.POINTER(ctypes.c_float)), shape=(self.n_vocab,)
                )

    def piece(self, token_id: int) -> bytes:
        """The bytes llama.cpp's vocabulary has for a token id (special tokens written out)."""
        buf = ctypes.create_string_buffer(256)
        n = llama_cpp.llama_token_to_piece(self._vocab, token_id, buf, len(buf), 0, True)
        if n < 0:  # the piece is longer than the buffer: -n bytes
            buf = ctypes.create_string_buffer(-n)
            n = llama_cpp.llama_token_to_piece(self._vocab, token_id, buf, len(buf), 0, True)
        return buf.raw[:n]

    def meta(self, key: str) -> str | None:
        """A scalar metadata value of the file, as text (None when it has no such key)."""
        size = 256
        while True:
            buf = ctypes.create_string_buffer(size)
            n = llama_cpp.llama_model_meta_val_str(self._model, key.encode(), buf, size)
            if n < 0:
                return None
            if n < size:
                return buf.value.decode()
            size = n + 1

    def reset(self, slot: int) -> None:
        """Forget what a slot holds (after a failed decode its KV is not what `held` says)."""
        llama_cpp.llama_memory_seq_rm(self._memory, slot, -1, -1)
        self.held[slot].clear()

    def close(self) -> None:
        """Free the batch, the context and the model (in that order); safe to call twice."""
        if self.closed:
            return
        self.closed = True
        llama_cpp.llama_batch_free(self._batch)
        llama_cpp.llama_free(self._ctx)
        llama_cpp.llama_model_free(self._model)

    def __del__(self) -> None:
        try:
            self.close()
        except (TypeError, AttributeError):  # interpreter shutdown: the bindings are gone
            pass


def _common(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n
