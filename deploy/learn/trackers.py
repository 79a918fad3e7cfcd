"""Experiment trackers for the learner's round metrics (`ARLOOP_REPORT_TO`, off by default):
each round's figures (reward, kl, clip_ratio, entropy, ...) as scalars at the version's number,
beside the Prometheus gauges and the round line that are always there."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Protocol

from learner.policy.registry import version_number

TRACKERS = ("tensorboard",)
"""What `report_to` may name (TensorBoard is the one a CPU install takes without an account)."""


class TrackerUnavailable(RuntimeError):
    """A tracker was asked for but its package is missing; the message names the install."""


class Tracker(Protocol):
    def log(self, version: str, metrics: dict[str, float], seconds: float) -> None: ...

    def close(self) -> None: ...


class TensorBoard:
    """Event files under `folder` (`tensorboard --logdir <folder>`), one step per version."""

    def __init__(self, folder: Path) -> None:
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as exc:  # torch raises this when the tensorboard package is absent
            raise TrackerUnavailable(
                "ARLOOP_REPORT_TO names tensorboard but it is not installed: "
                "pip install 'arloop[tensorboard]' (or remove it from ARLOOP_REPORT_TO)"
            ) from exc
        self.folder = folder
        self.writer: Any = SummaryWriter(log_dir=str(folder))

    def log(self, version: str, metrics: dict[str, float], seconds: float) -> None:
        step = version_number(version)
        for name, value in {**metrics, "seconds": seconds}.items():
            if isinstance(value, (int, float)) and math.isfinite(value):
                self.writer.add_scalar(f"round/{name}", float(value), step)
        self.writer.flush()  # a learner killed mid-run keeps every round it finished

    def close(self) -> None:
        self.writer.close()


class Trackers:
    """The trackers `report_to` names, each told every round."""

    def __init__(self, names: list[str], data_dir: Path) -> None:
        self.trackers: list[Tracker] = [
            TensorBoard(data_dir / "tensorboard") for name in names if name == "tensorboard"
        ]

    def log(self, version: str, metrics: dict[str, float], seconds: float) -> None:
        for tracker in self.trackers:
            tracker.log(version, metrics, seconds)

    def close(self) -> None:
        for tracker in self.trackers:
            tracker.close()
