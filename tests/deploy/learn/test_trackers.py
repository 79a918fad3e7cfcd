"""`ARLOOP_REPORT_TO`: a real round's metrics land in TensorBoard event files, at the version's
number; off by default; a tracker that is not installed is named with its install line."""

from __future__ import annotations

import sys

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from deploy.learn.settings import LearnerSettings
from deploy.learn.trackers import TensorBoard, TrackerUnavailable
from tests.deploy.learn.test_runner import _learner, _rated_runs


def test_a_rounds_metrics_go_to_tensorboard_when_asked(redis_url, redis_client, tmp_path):
    learner, _ = _learner(redis_url, tmp_path, report_to=["tensorboard"])
    _rated_runs(redis_client, 4)
    assert learner.run(once=True) == 0
    events = EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    tags = set(events.Tags()["scalars"])
    assert {"round/kl", "round/seconds"} <= tags, tags
    metric = next(t for t in sorted(tags) if t != "round/seconds")
    (point,) = events.Scalars(metric)
    assert point.step == 1  # v1
    assert point.value == pytest.approx(learner.last.metrics[metric.removeprefix("round/")])
    learner.store.close()


def test_no_tracker_by_default(tmp_path):
    assert LearnerSettings(_env_file=None, data_dir=tmp_path).report_to == []


def test_a_missing_tensorboard_names_the_install(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "tensorboard", None)  # as if not installed
    monkeypatch.delitem(sys.modules, "torch.utils.tensorboard", raising=False)
    with pytest.raises(TrackerUnavailable, match=r"pip install 'arloop\[tensorboard\]'"):
        TensorBoard(tmp_path)
