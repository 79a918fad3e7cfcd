"""One sample being generated: its parameters, and what each new token does to it.

A row samples its token from the batch's logits with its own temperature, top-p and seed,
records the token's logprob under the model's own distribution (temperature 1, what the
learner recomputes), decodes its text, and finishes on end of turn, a stop string, a
completed stop line (the line tool format's call line) or its token budget. Events go back
to the request through `emit`.
"""

from __future__ import annotations

import re
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

SEED_SPACE = 2**64  # torch.Generator seeds: a seed plus the choice's index wraps within it


@dataclass(frozen=True)
class SamplingParams:
    """How one row samples and when it stops."""

    temperature: float = 1.0  # 0 = greedy
    top_p: float = 1.0
    max_tokens: int = 16
    stop: tuple[str, ...] = ()
    seed: int | None = None
    top_logprobs: int = 0  # alternatives to report per token (0 = none)
    stop_line: str | None = None
    """A regex for a whole line: once such a line is complete, the row finishes there (its
    newline not in the text). The line tool format stops after a call line this way."""
    include_stop: bool = False
    """Keep the stop string that ended the row in its text (vLLM's `include_stop_str_in_output`)."""
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    """OpenAI's penalties on the tokens this row has generated so far (see `penalise`)."""
    logit_bias: tuple[tuple[int, float], ...] = ()
    """OpenAI's `logit_bias`: (token id, bias added to its logit before choosing)."""


class Constraint(Protocol):
    """What a row's output must match (a JSON schema, a forced tool call): a token mask."""

    def allowed(self, vocab: int) -> torch.Tensor | None:
        """(vocab,) bool: the tokens that may come next; None: any."""

    def advance(self, token: int) -> bool:
        """Take the chosen token; True when the output is complete (the row stops there)."""


@dataclass
class TokenEvent:
    """A row produced one token; `text` is the newly safe-to-show text (may be empty)."""

    index: int
    token_id: int
    logprob: float
    top: list[tuple[int, float]] | None
    text: str


@dataclass
class FinishEvent:
    """A row is done: its whole output (text already cut at a stop string)."""

    index: int
    finish_reason: str  # stop | length | error
    text: str
    token_ids: list[int]
    logprobs: list[float]
    tops: list[list[tuple[int, float]]]
    error: str | None = None


@dataclass(eq=False)
class Row:
    """One sample being generated: prompt, parameters, and what it produced so far."""

    policy: Any  # anything with .model and .tokenizer; rows batch together per policy
    prompt_ids: list[int]
    params: SamplingParams
    emit: Callable[[TokenEvent | FinishEvent], None]
    index: int = 0
    stream: bool = True  # emit a TokenEvent per token (else only the FinishEvent)
    enqueued_at: float = field(default_factory=time.monotonic)
    cancelled: bool = False
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    tops: list[list[tuple[int, float]]] = field(default_factory=list)
    text: str = ""
    sent: int = 0  # characters of text already emitted
    finish_reason: str | None = None
    generator: torch.Generator | None = None
    constraint: Constraint | None = None

    def finish(self, reason: str, error: str | None = None) -> None:
        self.finish_reason = reason
        self.emit(
            FinishEvent(
                self.index, reason, self.text, self.token_ids, self.logprobs, self.tops, error
            )
        )

    def seed_generator(self, device: torch.device) -> None:
        """Its own random stream: `seed + index` when seeded, so choice i is reproducible."""
        seed = (
            (self.params.seed + self.index) % SEED_SPACE
            if self.params.seed is not None
            else secrets.randbits(62)
        )
        self.generator = torch.Generator(device=device).manual_seed(seed)


def step(rows: list[Row], logits: torch.Tensor, tokenizer: Any, eos: set[int]) -> torch.Tensor:
    """Sample one token per row, record it with its logprobs, finish rows that are done.

    Penalties, logit biases and constraints shape which token is chosen (greedy or sampled);
    the logprobs recorded are the model's own, unshaped, at temperature 1 (what the learner
    recomputes)."""
    logp = torch.log_softmax(logits, dim=-1)  # (B, V) the model's own distribution
    chosen_from = _constrained(rows, _penalised(rows, logits))  # (B, V)
    tokens = chosen_from.argmax(dim=-1)  # (B,) greedy unless the row samples
    for i, row in enumerate(rows):
        if row.params.temperature > 0:
            tokens[i] = _sample(chosen_from[i], row.params, row.generator)
    chosen = logp.gather(-1, tokens[:, None]).squeeze(-1).tolist()  # (B,)
    k = max(r.params.top_logprobs for r in rows)
    top_vals, top_ids = logp.topk(k, dim=-1) if k else (None, None)  # (B, k)
    for i, (row, token) in enumerate(zip(rows, tokens.tolist(), strict=True)):
        top = None
        if row.params.top_logprobs:
            n = row.params.top_logprobs
            top = list(zip(top_ids[i, :n].tolist(), top_vals[i, :n].tolist(), strict=True))
        _record(row, token, chosen[i], top, tokenizer, eos)
        if row.constraint is not None and row.finish_reason is None:
            if row.constraint.advance(token):
                row.finish("stop")
    return tokens


def _constrained(rows: list[Row], logits: torch.Tensor) -> torch.Tensor:
    """Each row's logit biases added and the tokens its constraint forbids removed. (B, V)"""
    todo = [i for i, r in enumerate(rows) if r.constraint is not None or r.params.logit_bias]
    if not todo:
        return logits
    out = logits.clone()
    vocab = logits.shape[-1]
    for i in todo:
        for token, bias in rows[i].params.logit_bias:
            if token < vocab:
                out[i, token] += bias
        mask = rows[i].constraint.allowed(vocab) if rows[i].constraint is not None else None
        if mask is not None:
            out[i] = out[i].masked_fill(~mask.to(out.device), float("-inf"))
    return out


def penalise(
    logits: torch.Tensor, counts: torch.Tensor, frequency: float, presence: float
) -> torch.Tensor:
    """OpenAI's penalties: `mu[j] - c[j] * frequency - (c[j] > 0) * presence`, where `c[j]` is
    how often token j was generated so far. logits, counts: (V,) -> (V,)."""
    return logits - counts * frequency - (counts > 0).to(logits.dtype) * presence


def _penalised(rows: list[Row], logits: torch.Tensor) -> torch.Tensor:
    """The batch's logits with each row's penalties on its own completion so far. (B, V)"""
    todo = [
        i
        for i, r in enumerate(rows)
        if r.token_ids and (r.params.frequency_penalty or r.params.presence_penalty)
    ]
    if not todo:
        return logits
    out = logits.clone()  # (B, V)
    for i in todo:
        p = rows[i].params
        ids = torch.tensor(rows[i].token_ids, device=logits.device)
        counts = torch.bincount(ids, minlength=logits.shape[-1])[: logits.shape[-1]]  # (V,)
        out[i] = penalise(
            logits[i], counts.to(logits.dtype), p.frequency_penalty, p.presence_penalty
        )
    return out


def _sample(logits: torch.Tensor, params: SamplingParams, gen: torch.Generator) -> torch.Tensor:
    probs = torch.softmax(logits / params.temperature, dim=-1)  # (V,)
    if params.top_p < 1.0:
        sorted_p, order = probs.sort(descending=True)
        drop = sorted_p.cumsum(-1) - sorted_p > params.top_p  # keeps at least the first token
        sorted_p[drop] = 0.0
        probs = torch.zeros_like(probs).scatter_(-1, order, sorted_p)
    return torch.multinomial(probs, 1, generator=gen)[0]


def _record(row: Row, token: int, logprob: float, top, tokenizer: Any, eos: set[int]) -> None:
    row.token_ids.append(token)
    row.logprobs.append(logprob)
    if top is not None:
        row.tops.append(top)
    text = tokenizer.decode(row.token_ids, skip_special_tokens=True)
    cut = _find_stop(text, row.params.stop, len(row.text), row.params.include_stop)
    if row.params.stop_line is not None:
        line_end = _find_stop_line(text[:cut], row.params.stop_line, len(row.text))
        cut = line_end if line_end is not None else cut
    row.text = text if cut is None else text[:cut]
    safe = row.text if cut is not None else row.text[: safe_len(row.text, row.params.stop)]
    delta, row.sent = safe[row.sent :], max(row.sent, len(safe))
    if row.stream:
        row.emit(TokenEvent(row.index, token, logprob, top, delta))
    if cut is not None or token in eos:
        row.finish("stop")
    elif len(row.token_ids) >= row.params.max_tokens:
        row.finish("length")


def _find_stop(
    text: str, stops: tuple[str, ...], previous_len: int, include: bool = False
) -> int | None:
    """Where the text ends at the first stop string: where it starts, or (`include`) where it
    ends; looking only where the new text could complete one."""
    hits = []
    for stop in stops:
        at = text.find(stop, max(0, previous_len - len(stop) + 1))
        if at >= 0:
            hits.append((at, at + len(stop) if include else at))
    return min(hits)[1] if hits else None


def _find_stop_line(text: str, pattern: str, previous_len: int) -> int | None:
    """Where a line matching `pattern` that the new text completed ends (at its newline)."""
    newline = text.find("\n", max(0, previous_len - 1))
    while newline >= 0:
        start = text.rfind("\n", 0, newline) + 1
        if re.fullmatch(pattern, text[start:newline]):  # re caches the compiled pattern
            return newline
        newline = text.find("\n", newline + 1)
    return None


def safe_len(text: str, stops: tuple[str, ...]) -> int:
    """How much text can be shown: not a half-decoded character, not a possible stop's start."""
    end = len(text.rstrip("\ufffd"))
    for stop in stops:
        for k in range(min(len(stop) - 1, end), 0, -1):
            if text[end - k : end] == stop[:k]:
                end -= k
                break
    return end
