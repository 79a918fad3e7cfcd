"""The reward model in a round: fitted on the store's judged runs, it scores silent runs and is
checked against the verifier.

Production gives most runs no feedback at all. A round fits `learner.reward_model`'s bootstrap
ensemble on every run in the store that users judged (thumbs, ratings, outcomes), on the frozen
policy's features; when its held-out AUROC reaches `reward_model_min_auroc`, each silent run of
the round is trained on with the ensemble's pessimistic score (mean - k * spread: a run unlike
anything users judged scores low, not high). In the verified sub-rounds the same ensemble
judges the resampled runs the verifier scored, and the two verdicts go beside the checkpoint
(`source_scores.json`): the gate's `reward_disagreement` guard then rejects a version trained
on a reward model that misjudges what the verifier can check.
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from agents.events import TrajectoryEvent
from learner.config import RoundConfig
from learner.reward_model import FitReport, features, fit_from_runs
from learner.store import Store

log = logging.getLogger(__name__)

SOURCE_SCORES_FILE = "source_scores.json"
"""Beside a checkpoint: per verified replay, the verifier's and the reward model's verdicts."""
MAX_FIT_RUNS = 1024
"""The newest judged runs a round fits its reward model on (each costs a forward pass)."""

Verdicts = Callable[[list[list[int]], list[list[int]]], list[float]]
"""(prompt ids, completion ids) per run -> the reward model's mean score in [-1, 1] per run."""


@dataclass
class Judge:
    """A round's reward model: its fit (None: too little data) and how the round uses it."""

    report: FitReport | None
    model: torch.nn.Module
    """The frozen policy the features come from (before the trainer attaches anything)."""
    pad_id: int
    k: float
    min_auroc: float
    fit_s: float

    @property
    def used(self) -> bool:
        """Whether its scores train: a fit whose held-out AUROC reaches the bar."""
        r = self.report
        return r is not None and math.isfinite(r.auroc) and r.auroc >= self.min_auroc

    def score_runs(self, trajectories: Sequence[TrajectoryEvent]) -> dict[str, float]:
        """Trajectory id -> pessimistic score of its final answer (runs with logged ids)."""
        rows = [(t.event_id, t.model_steps[-1]) for t in trajectories if t.model_steps]
        rows = [(i, s) for i, s in rows if s.prompt_token_ids and s.completion_token_ids]
        if not rows or self.report is None:
            return {}
        x = self._features(
            self.model,
            [s.prompt_token_ids for _, s in rows],
            [s.completion_token_ids for _, s in rows],
        )
        scores = self.report.model.pessimistic(x, k=self.k)  # (N,)
        return {i: float(v) for (i, _), v in zip(rows, scores.tolist(), strict=True)}

    def verdicts(self, trainer: Any) -> Verdicts:
        """The ensemble's mean score of resampled runs, on the trainer's frozen reference."""

        def judge(prompts: list[list[int]], completions: list[list[int]]) -> list[float]:
            module, context = trainer.frozen_view()
            with context:
                x = self._features(module, prompts, completions)
            mean, _ = self.report.model.scores(x)  # type: ignore[union-attr]
            return mean.tolist()

        return judge

    def metrics(self, scored: int) -> dict[str, float]:
        """`reward_model/*` for the round's metrics, and how many silent runs it scored."""
        out = {"reward_model/used": float(self.used), "reward_model/fit_s": self.fit_s}
        out["reward_sources/reward_model"] = float(scored)
        if self.report is not None:
            r = self.report
            out.update(
                {
                    "reward_model/auroc": r.auroc,
                    "reward_model/train_runs": float(r.train_runs),
                    "reward_model/heldout_runs": float(r.heldout_runs),
                    "reward_model/heads": float(r.heads),
                }
            )
        return out

    def _features(self, module, prompts, completions) -> torch.Tensor:
        return features(module, prompts, completions, self.pad_id)


def fit_judge(
    store: Store, model: torch.nn.Module, pad_id: int, config: RoundConfig, seed: int
) -> Judge:
    """Fit the round's reward model on the store's judged runs (newest first)."""
    start = time.perf_counter()
    runs = store.rewarded_runs(limit=MAX_FIT_RUNS)
    report = fit_from_runs(
        runs,
        lambda prompts, completions: features(model, prompts, completions, pad_id),
        heads=config.reward_model_heads,
        seed=seed,
        min_runs=config.reward_model_min_runs,
    )
    judge = Judge(
        report,
        model,
        pad_id,
        config.reward_model_k,
        config.reward_model_min_auroc,
        time.perf_counter() - start,
    )
    if report is not None and not judge.used:
        log.info(
            "reward model: held-out AUROC %.2f below %.2f on %d runs: its scores train nothing",
            report.auroc,
            config.reward_model_min_auroc,
            report.heldout_runs,
        )
    return judge


def write_source_scores(directory: Path, judged: Sequence[tuple[float, float]]) -> None:
    """(verifier, reward model) verdicts of the verified replays, beside the checkpoint."""
    scores = {f"replay/{n}": {"verifier": v, "reward_model": r} for n, (v, r) in enumerate(judged)}
    (Path(directory) / SOURCE_SCORES_FILE).write_text(json.dumps(scores))


def read_source_scores(directory: Path) -> dict[str, dict[str, float]]:
    """What `write_source_scores` wrote; {} when the checkpoint has none."""
    path = Path(directory) / SOURCE_SCORES_FILE
    if not path.exists():
        return {}
    return json.loads(path.read_text())
