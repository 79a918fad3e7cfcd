"""Behaviour logprobs in the learner's own numerics, where the serving engine's differ.

A policy server on llama.cpp with a quantised export (`ARLOOP_LLAMACPP_QUANT=q8_0`, the
default) logs logprobs that differ from what the learner's fp32 weights give the same tokens:
0.03-0.04 a token on SmolLM2-135M's served tokens (docs "Figures"). In the importance weight
min(exp(proximal - behaviour), cap) that difference is noise on every token. So a round
replaces the logged logprobs of the steps it will train, where the step names such an engine,
by those of the fp32 weights of the version that served them (each such version loaded once),
and reports the gap it replaced. An F16 export's gap (0.0015) is not worth that forward pass
per step: its logprobs, like transformers', are kept as logged.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import torch

from agents.events import ModelStep
from learner.episodes import Episode
from learner.logprobs import make_batch, selected_logprobs

KEPT_ENGINES = ("transformers", "llamacpp-f16", "llamacpp-f32")
"""Engines whose logged logprobs are used as they are: the learner's own numerics (fp32 torch),
or llama.cpp on unquantised weights (a gap of 0.0015-0.002 a token, bench_policy_server.py)."""
RELOGGED = "transformers-fp32"  # what a relogged step says computed its logprobs


def relog_needed(step: ModelStep) -> bool:
    """Whether a step's logprobs came from an engine whose numerics are not the learner's."""
    return (
        step.engine is not None
        and not step.engine.startswith(KEPT_ENGINES)
        and bool(step.prompt_token_ids)
        and bool(step.completion_token_ids)
        and step.logprobs is not None
    )


@dataclass(frozen=True)
class BehaviourGap:
    """What recomputing changed: steps and tokens, and the sum of |logged - recomputed|."""

    steps: int = 0
    tokens: int = 0
    abs_sum: float = 0.0
    kept: int = 0  # steps to recompute whose version could not be loaded: logged values kept

    @property
    def mean(self) -> float:
        """Mean |logged - recomputed| per token (NaN when nothing was recomputed)."""
        return self.abs_sum / self.tokens if self.tokens else float("nan")

    def metrics(self) -> dict[str, float]:
        return {
            "behaviour/engine_gap": self.mean,
            "behaviour/recomputed_steps": float(self.steps),
            "behaviour/kept_logged_steps": float(self.kept),
        }


def relog_behaviour(
    episodes: Sequence[Episode],
    trained: Callable[[Episode, ModelStep], bool],
    load: Callable[[str], torch.nn.Module | None],
    pad_id: int,
    batch_size: int = 8,
) -> tuple[list[Episode], BehaviourGap]:
    """The episodes with their trained, inexactly logged steps relogged by `load(version)`.

    `trained(episode, step)` says which steps the round trains; `load` returns the fp32 model
    of a policy version (None: it cannot, and the logged values stay).
    """
    todo: dict[str, list[tuple[int, ModelStep]]] = {}
    for n, episode in enumerate(episodes):
        for step in episode.trajectory.model_steps:
            if relog_needed(step) and trained(episode, step):
                todo.setdefault(step.policy_version, []).append((n, step))
    fresh: dict[int, list[float]] = {}  # id(step) -> recomputed logprobs
    gap = BehaviourGap()
    for version, steps in sorted(todo.items()):
        model = load(version)
        if model is None:
            gap = replace(gap, kept=gap.kept + len(steps))
            continue
        for chunk in _chunks([s for _, s in steps], batch_size):
            for step, values in zip(chunk, _logprobs(model, chunk, pad_id), strict=True):
                fresh[id(step)] = values
                delta = sum(abs(a - b) for a, b in zip(step.logprobs, values, strict=True))
                gap = replace(
                    gap,
                    steps=gap.steps + 1,
                    tokens=gap.tokens + len(values),
                    abs_sum=gap.abs_sum + delta,
                )
        del model
    return [_with_logprobs(e, fresh) for e in episodes], gap


def _logprobs(model: torch.nn.Module, steps: list[ModelStep], pad_id: int) -> list[list[float]]:
    """Each step's completion logprobs under `model` (one forward for the chunk)."""
    batch = make_batch(
        [s.prompt_token_ids for s in steps], [s.completion_token_ids for s in steps], pad_id
    )
    with torch.no_grad():
        flat, _ = selected_logprobs(model, batch)  # (N,) the completion tokens, row by row
    values, start = [], 0
    for s in steps:
        n = len(s.completion_token_ids)
        values.append(flat[start : start + n].tolist())
        start += n
    return values


def _chunks(steps: list[ModelStep], size: int) -> list[list[ModelStep]]:
    """Chunks of similar length (less padding), longest first."""
    ordered = sorted(
        steps, key=lambda s: len(s.prompt_token_ids) + len(s.completion_token_ids), reverse=True
    )
    return [ordered[i : i + size] for i in range(0, len(ordered), size)]


def _with_logprobs(episode: Episode, fresh: dict[int, list[float]]) -> Episode:
    if not any(id(s) in fresh for s in episode.trajectory.steps):
        return episode
    steps = [
        s.model_copy(update={"logprobs": fresh[id(s)], "engine": RELOGGED}) if id(s) in fresh else s
        for s in episode.trajectory.steps
    ]
    return replace(episode, trajectory=episode.trajectory.model_copy(update={"steps": steps}))
