"""Helpers of the learner's process-level tests."""

from __future__ import annotations

from learner.config import RoundConfig
from learner.policy.registry import PolicyRegistry
from learner.rounds import RoundPlan
from learner.store import Store
from learner.train_step import TrainConfig
from tests.model_cache import MODEL_CACHE, model_cache  # noqa: F401 - the fixture, re-exported


def open_store(tmp_path) -> Store:
    return Store(tmp_path / "learner" / "store.db")


def base_registry(client) -> PolicyRegistry:
    """A registry with the tiny base model as v0 and champion."""
    registry = PolicyRegistry(client)
    registry.ensure_base("tiny")
    return registry


def tiny_round_plan(tmp_path, train: TrainConfig | None = None, **round_knobs) -> RoundPlan:
    """A round on the tiny model that moves it visibly in one update."""
    train = train or TrainConfig(
        learning_rate=5e-2, lora_rank=8, lora_alpha=16, kl_coef=0.0, micro_batch_size=8
    )
    return RoundPlan(
        checkpoints_dir=tmp_path / "checkpoints",
        model_cache=MODEL_CACHE,
        train=train,
        round=RoundConfig(**{"feedback_window_s": 600.0, "batch_size": 16, **round_knobs}),
        actor="test",
    )
