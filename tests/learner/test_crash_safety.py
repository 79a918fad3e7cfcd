"""kill -9 of a real learner process at each named point: after a restart, none lost or doubled.

The learner runs as its own OS process (`python -m deploy.learn.runner --once`) on the tiny
model; `ARLOOP_CRASH_AT=<point>` makes it SIGKILL itself there (learner/crashpoints.py).
"""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from rich.console import Console

from agents.events import LEARNER_GROUP, ONE_SHARD, StreamShards
from deploy.learn.loop import Learner
from deploy.learn.settings import LearnerSettings
from learner.policy.registry import CHAMPION, PolicyRegistry
from learner.store import Store
from tests.learner.learner_events import feedback, trajectory, xadd
from tests.model_cache import MODEL_CACHE
from tests.shard_ids import spread_ids

REPO = Path(__file__).resolve().parents[2]


def _env(redis_url: str, data_dir: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ARLOOP_")}
    env.update(
        ARLOOP_REDIS_URL=redis_url,
        ARLOOP_DATA_DIR=str(data_dir),
        ARLOOP_MODEL_CACHE=str(MODEL_CACHE),
        ARLOOP_BASE_MODEL="tiny",
        ARLOOP_MIN_EPISODES="1",
        ARLOOP_TRAIN__LEARNING_RATE="0.05",
        ARLOOP_READ_BLOCK_MS="50",
        ARLOOP_LABEL_PACKS='["tutoring"]',  # the runs' feedback labels them: sub-rounds run
        ARLOOP_POLICY_MAX_TOKENS="16",
        ARLOOP_METRICS_PORT="0",  # no /metrics: learners of parallel tests would race for 8002
        ARLOOP_EVAL_GATE="false",  # each round's version becomes champion
        PYTHONUNBUFFERED="1",
        **extra,
    )
    return env


def _learn_once(redis_url: str, data_dir: Path, crash_at: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "deploy.learn.runner", "--once"],
        cwd=REPO,
        timeout=240,
        env=_env(redis_url, data_dir, ARLOOP_CRASH_AT=crash_at),
        capture_output=True,
        text=True,
    )


def _settings(redis_url: str, data_dir: Path) -> LearnerSettings:
    return LearnerSettings(
        redis_url=redis_url,
        data_dir=data_dir,
        base_model="tiny",
        min_episodes=1,
        train={"learning_rate": 0.05},
        read_block_ms=50,
        label_packs=["tutoring"],
        policy_max_tokens=16,
        eval_gate=False,
    )


def _seed(redis_client, n: int = 4, shards: StreamShards = ONE_SHARD) -> list[str]:
    """`n` runs, each with a thumbs, on the shards in turn."""
    ids = []
    runs = spread_ids(shards)
    for i in range(n):
        answer = "#### 42" if i % 2 else "#### 40"
        t = trajectory(answer=answer, logprobs=True, user=f"u{i}", event_id=next(runs))
        f = feedback(t.event_id, "thumbs", 1 if i % 2 else -1, user=f"u{i}")
        for e in (t, f):
            xadd(redis_client, e, shards)
            ids.append(e.event_id)
    return ids


def _pending(redis_client, shards: StreamShards = ONE_SHARD) -> int:
    return sum(
        redis_client.xpending(s, LEARNER_GROUP)["pending"]
        for s in shards.all_trajectories() + shards.all_feedback()
    )


def _stored(data_dir: Path, ids: list[str]) -> set[str]:
    store = Store(data_dir / "learner" / "store.db")
    try:
        return {i for i in ids if store.has_event(i)}
    finally:
        store.close()


def _manifests(data_dir: Path) -> dict[str, list[str]]:
    folder = data_dir / "checkpoints"
    return {
        p.name: json.loads((p / "manifest.json").read_text())["trained_event_ids"]
        for p in (sorted(folder.iterdir()) if folder.is_dir() else [])
    }


CRASH_STATE = {
    # point: (persisted, pending in redis, ledger entries, versions in the registry)
    "after_read": (False, True, False, ["v0"]),
    "after_persist": (True, True, False, ["v0"]),
    "during_subround": (True, False, False, ["v0"]),
    "during_train": (True, False, False, ["v0"]),
    "after_checkpoint": (True, False, False, ["v0"]),
    "after_commit": (True, False, True, ["v0"]),
}


@pytest.mark.parametrize("point", list(CRASH_STATE))
def test_kill_9_then_restart_trains_every_event_exactly_once(
    point, redis_url, redis_client, tmp_path
):
    ids = _seed(redis_client)
    crashed = _learn_once(redis_url, tmp_path, point)
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr[-2000:]

    persisted, pending, committed, versions = CRASH_STATE[point]
    stored = _stored(tmp_path, ids)
    assert stored == (set(ids) if persisted else set())
    assert _pending(redis_client) == (len(ids) if pending else 0)
    assert stored | (set(ids) if pending else set()) == set(ids)  # nothing acked is lost
    registry = PolicyRegistry(redis_client)
    assert [v.version for v in registry.versions()] == versions

    out = io.StringIO()
    learner = Learner(_settings(redis_url, tmp_path), Console(file=out, width=200))
    assert learner.run(once=True) == 0, out.getvalue()
    if not committed:  # the restart's round replayed the labelled prompt in sub-rounds
        assert learner.last.metrics["labels/replayed"] == 1

    ledger = learner.store.ledger()
    assert set(ledger) == set(ids)  # every event trained on...
    manifests = _manifests(tmp_path)
    trained = [i for m in manifests.values() for i in m]
    assert sorted(trained) == sorted(ids)  # ...exactly once, across every checkpoint kept
    assert set(manifests) == set(ledger.values()) == {registry.resolve(CHAMPION)}
    assert _pending(redis_client) == 0
    if committed:
        assert "recovered v1" in out.getvalue() and set(ledger.values()) == {"v1"}
    learner.store.close()


def test_sigterm_stops_the_learner_cleanly(redis_url, redis_client, tmp_path):
    proc = subprocess.Popen(
        [sys.executable, "-m", "deploy.learn.runner"],
        cwd=REPO,
        text=True,
        env=_env(redis_url, tmp_path),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        lines = []
        while not any("learning from" in line for line in lines) and len(lines) < 10:
            lines.append(proc.stdout.readline())  # the metrics port and the lease come first
        assert any("learning from" in line for line in lines), lines
        time.sleep(0.5)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
        assert "learner stopped" in proc.stdout.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
