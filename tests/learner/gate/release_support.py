"""Helpers of the release tests: registered versions with checkpoint files, logged runs per arm."""

from __future__ import annotations

import time
from pathlib import Path

from agents.events import FeedbackEvent, FeedbackKind, ModelStep, TrajectoryEvent, new_id
from learner.policy.registry import PolicyRegistry, PolicyVersion
from learner.store import Store


def add_version(registry: PolicyRegistry, folder: Path, parent: str = "v0") -> str:
    """The next version with a LoRA checkpoint folder holding the files a server needs."""
    version = registry.next_version()
    path = folder / version
    path.mkdir(parents=True)
    (path / "adapter_config.json").write_text("{}")
    (path / "adapter_model.safetensors").write_bytes(b"weights")
    registry.publish(
        PolicyVersion(
            version=version,
            parent=parent,
            base_model="tiny",
            checkpoint_uri=path.resolve().as_uri(),
            checkpoint_kind="lora",
        )
    )
    return version


def run(version: str, *, finished_at: float | None = None, answer: str = "ok") -> TrajectoryEvent:
    """A one-step run served by `version`, as the agent API logs it."""
    now = time.time() if finished_at is None else finished_at
    step = ModelStep(
        index=0,
        messages=[{"role": "user", "content": "hi"}],
        output=answer,
        model="arloop@candidate",
        policy_version=version,
        latency_ms=1.0,
    )
    return TrajectoryEvent(
        event_id=new_id("traj"),
        thread_id=new_id("th"),
        agent="tutor",
        user_id="u",
        input="hi",
        output=answer,
        policy_version=version,
        steps=[step],
        started_at=now - 1,
        finished_at=now,
    )


def thumbs(t: TrajectoryEvent, up: bool, user: str = "u") -> FeedbackEvent:
    return FeedbackEvent(
        event_id=new_id("fb"),
        trajectory_id=t.event_id,
        user_id=user,
        kind=FeedbackKind.THUMBS,
        value=1 if up else -1,
        policy_version=t.policy_version,
    )


def log_arm(store: Store, version: str, ups: int, downs: int, **kw) -> None:
    """`ups + downs` rated runs of `version` into the learner's store."""
    events = []
    for i in range(ups + downs):
        t = run(version, **kw)
        events += [t, thumbs(t, i < ups, user=f"u{i}")]
    store.add_events(events)
