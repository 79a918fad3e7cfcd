"""Helpers of the learner's process-level tests; `model_cache` is a fixture (usefixtures)."""

from __future__ import annotations

import os

import pytest

from learner.policy.registry import PolicyRegistry
from learner.rounds import RoundConfig
from learner.store import Store
from learner.train_step import TrainConfig


@pytest.fixture(scope="session")
def model_cache(tmp_path_factory):
    """A private model cache, so `load_base("tiny")` builds the tiny model in a temp dir."""
    path = tmp_path_factory.mktemp("model-cache")
    saved = os.environ.get("ARLOOP_MODEL_CACHE")
    os.environ["ARLOOP_MODEL_CACHE"] = str(path)
    yield path
    if saved is None:
        os.environ.pop("ARLOOP_MODEL_CACHE", None)
    else:
        os.environ["ARLOOP_MODEL_CACHE"] = saved


def open_store(tmp_path) -> Store:
    return Store(tmp_path / "learner" / "store.db")


def base_registry(client) -> PolicyRegistry:
    """A registry with the tiny base model as v0 and champion."""
    registry = PolicyRegistry(client)
    registry.ensure_base("tiny")
    return registry


def tiny_round_config(tmp_path, **overrides) -> RoundConfig:
    """A round on the tiny model that moves it visibly in one update."""
    train = TrainConfig(lr=5e-2, lora_rank=8, lora_alpha=16, kl_coef=0.0, micro_batch_size=8)
    values = dict(
        base_model="tiny",
        checkpoints_dir=tmp_path / "checkpoints",
        train=train,
        feedback_window_s=600.0,
        batch_size=16,
        actor="test",
    )
    values.update(overrides)
    return RoundConfig(**values)
