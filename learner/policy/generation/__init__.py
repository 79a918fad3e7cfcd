"""Batched generation as the policy server runs it, for the server and for the learner.

The engine (`engine.py`, rows in `rows.py`, shared-head KV in `prefix_cache.py`) lives here,
under `learner.policy`, because two processes sample with it: the policy server for its
clients, and the learner when it resamples logged prompts from the weights it is training
(`generate`). One sampler means a seeded request gives the same tokens and logprobs in both.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from learner.policy.generation.engine import GenerationEngine
from learner.policy.generation.rows import FinishEvent, Row, SamplingParams, TokenEvent

__all__ = ["FinishEvent", "GenerationEngine", "Row", "SamplingParams", "TokenEvent", "generate"]


@dataclass(frozen=True)
class _Policy:
    model: Any
    tokenizer: Any


def generate(
    model: Any,
    tokenizer: Any,
    prompts: Sequence[Sequence[int]],
    params: Sequence[SamplingParams],
    *,
    n: int = 1,
    max_batch_size: int = 8,
    prefix_entries: int = 8,
    timeout_s: float = 3600.0,
) -> list[list[FinishEvent]]:
    """`n` finished samples per prompt (prompt i with `params[i]`), in this process.

    As the server answers a request with `n` choices: choice k of a prompt is seeded
    `seed + k`. The rows go to a fresh engine in submission order, so a fixed seed and thread
    count give the same batches and tokens every time; a fresh engine also means no shared-head
    KV survives from weights that have since been trained.
    """
    if len(prompts) != len(params):
        raise ValueError(f"{len(prompts)} prompts but {len(params)} sampling params")
    done: list[list[FinishEvent | None]] = [[None] * n for _ in prompts]
    left = threading.Semaphore(0)

    def emitter(i: int):
        def emit(event: TokenEvent | FinishEvent) -> None:
            if isinstance(event, FinishEvent):
                done[i][event.index] = event
                left.release()

        return emit

    policy = _Policy(model, tokenizer)
    rows = [
        Row(policy, list(p), sp, emitter(i), index=k, stream=False)
        for i, (p, sp) in enumerate(zip(prompts, params, strict=True))
        for k in range(n)
    ]
    if not rows:
        return [[] for _ in prompts]
    engine = GenerationEngine(max_batch_size, batch_window_s=0.0, prefix_entries=prefix_entries)
    engine.start()
    try:
        engine.submit(rows)
        for _ in rows:
            if not left.acquire(timeout=timeout_s):
                raise TimeoutError(f"in-process generation gave no result in {timeout_s:.0f} s")
    finally:
        engine.stop()
    events = [[e for e in choices if e is not None] for choices in done]
    failed = [e for choices in events for e in choices if e.finish_reason == "error"]
    if failed:
        raise RuntimeError(f"in-process generation failed: {failed[0].error}")
    return events
