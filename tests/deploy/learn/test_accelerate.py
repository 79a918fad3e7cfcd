"""The learner under `accelerate launch` with 2 CPU processes (gloo) on the tiny model.

`accelerate launch --multi_gpu --num_processes 2` starts the ranks through torchrun; on this
machine without a GPU they train on the CPU (`deploy.learn.ranks.join`). Each rank runs one
torch thread. Real Redis, real processes; rank 1 is killed with SIGKILL by a crash point.
"""

from __future__ import annotations

import io
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from rich.console import Console
from safetensors.torch import load_file

from agents.events import LEARNER_GROUP, LEARNER_LEASE, STREAM_FEEDBACK, STREAM_TRAJECTORIES
from deploy.embedded_redis import free_port
from deploy.learn.loop import Learner
from deploy.learn.settings import LearnerSettings
from learner.policy.registry import CHAMPION, PolicyRegistry
from learner.store import Store
from tests.learner.learner_events import feedback, trajectory, xadd, xadd_all
from tests.model_cache import MODEL_CACHE

REPO = Path(__file__).resolve().parents[3]
ACCELERATE = Path(sys.executable).parent / "accelerate"
LR = 0.05


def _env(redis_url: str, data_dir: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ARLOOP_")}
    env.update(
        ARLOOP_REDIS_URL=redis_url,
        ARLOOP_DATA_DIR=str(data_dir),
        ARLOOP_MODEL_CACHE=str(MODEL_CACHE),
        ARLOOP_BASE_MODEL="tiny",
        ARLOOP_MIN_EPISODES="1",
        ARLOOP_TRAIN__LEARNING_RATE=str(LR),
        ARLOOP_READ_BLOCK_MS="50",
        ARLOOP_METRICS_PORT="0",
        ARLOOP_COLLECTIVE_TIMEOUT_S="30",
        ARLOOP_EVAL_GATE="false",  # the round is promoted as it publishes: no policy server here
        OMP_NUM_THREADS="1",  # one torch thread per rank (accelerate reads it)
        PYTHONUNBUFFERED="1",
    )
    return env | extra


def _launch(redis_url: str, data_dir: Path, **extra: str) -> subprocess.CompletedProcess:
    """`accelerate launch --multi_gpu --num_processes 2 -m deploy.cli learn --once`."""
    return subprocess.run(
        [
            *(str(ACCELERATE), "launch", "--multi_gpu", "--num_processes", "2"),
            *("--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no"),
            *("--main_process_port", str(free_port())),
            *("-m", "deploy.cli", "learn", "--once"),
        ],
        cwd=REPO,
        env=_env(redis_url, data_dir, **extra),
        capture_output=True,
        text=True,
        timeout=240,
    )


def _events(n: int = 4) -> list:
    out = []
    for i in range(n):
        t = trajectory(answer="The answer is 42." if i % 2 else "no", logprobs=True, user=f"u{i}")
        out += [t, feedback(t.event_id, "thumbs", 1 if i % 2 else -1, user=f"u{i}")]
    return out


def _learn_here(redis_url: str, data_dir: Path, **extra) -> tuple[int, str, Learner]:
    """One round in this process (one rank, no launcher)."""
    out = io.StringIO()
    settings = LearnerSettings(
        _env_file=None,
        redis_url=redis_url,
        data_dir=data_dir,
        model_cache=MODEL_CACHE,
        base_model="tiny",
        min_episodes=1,
        read_block_ms=50,
        train={"learning_rate": LR},
        metrics_port=0,
        eval_gate=False,
        **extra,
    )
    learner = Learner(settings, Console(file=out, width=300))
    code = learner.run(once=True)
    learner.store.close()
    return code, out.getvalue(), learner


def _trained_once(data_dir: Path, ids: list[str]) -> dict[str, str]:
    """The ledger, after checking every event is in it and in exactly one manifest."""
    store = Store(data_dir / "learner" / "store.db")
    ledger = store.ledger()
    store.close()
    manifests = [
        json.loads(p.read_text())["trained_event_ids"]
        for p in sorted((data_dir / "checkpoints").glob("v*/manifest.json"))
    ]
    assert sorted(i for m in manifests for i in m) == sorted(ids)
    assert set(ledger) == set(ids)
    return ledger


def _pending(redis_client) -> int:
    streams = (STREAM_TRAJECTORIES, STREAM_FEEDBACK)
    return sum(redis_client.xpending(s, LEARNER_GROUP)["pending"] for s in streams)


def _adapter(data_dir: Path, version: str) -> dict[str, torch.Tensor]:
    return load_file(data_dir / "checkpoints" / version / "adapter_model.safetensors")


def _corrected() -> list:
    """One run and its correction: one DPO pair, nothing else to train."""
    t = trajectory(answer="The answer is 41.", logprobs=True, user="u0")
    return [t, feedback(t.event_id, "correction", None, text="The answer is 42.", user="u0")]


@pytest.mark.parametrize("events", [_events(), _corrected()], ids=["2-per-rank", "1-for-2"])
def test_two_ranks_train_one_round_as_one_process_would(events, redis_url, redis_client, tmp_path):
    """4 rated runs: each rank trains 2 of the batch's samples by policy gradient; 1 DPO pair:
    both ranks train it (a rank with nothing could not join the all-reduce): the same mean."""
    ids = [e.event_id for e in events]
    for e in events:
        xadd(redis_client, e)
    launched = _launch(redis_url, tmp_path / "two")
    output = launched.stdout + launched.stderr
    assert launched.returncode == 0, output[-6000:]
    assert "rank 1: following rank 0" in output, output[-4000:]
    registry = PolicyRegistry(redis_client)
    assert [v.version for v in registry.versions()] == ["v0", "v1"]
    assert registry.aliases()[CHAMPION] == "v1"
    assert set(_trained_once(tmp_path / "two", ids).values()) == {"v1"}
    assert _pending(redis_client) == 0

    # each rank printed the digest of its weights after the update: the same bytes
    digests = dict(re.findall(r"rank (\d): trained weights sha256 ([0-9a-f]{16})", output))
    assert set(digests) == {"0", "1"} and digests["0"] == digests["1"], output[-4000:]

    two_metrics = registry.get("v1").metrics
    # the same events, one process, a fresh Redis and data directory: the same update
    redis_client.flushall()
    for e in events:
        xadd(redis_client, e)
    code, said, _ = _learn_here(redis_url, tmp_path / "one")
    assert code == 0, said
    two, one = _adapter(tmp_path / "two", "v1"), _adapter(tmp_path / "one", "v1")
    base = _adapter_start(tmp_path / "one")
    assert set(two) == set(one)
    moved = max(float((one[k] - base[k]).abs().max()) for k in one)
    assert moved > LR / 2, "the round did not train: nothing to compare"
    # the same batch split in two, the gradients averaged: the same loss and gradient norm
    # (a sum instead of a mean would double both), up to the order of the float sums
    one_metrics = registry.get("v1").metrics
    names = ["loss", "grad_norm", "num_tokens", "entropy", "dpo/loss", "dpo/grad_norm"]
    names = [n for n in names if n in one_metrics]
    assert len(names) >= 2, one_metrics
    for name in names:
        assert two_metrics[name] == pytest.approx(one_metrics[name], rel=1e-5), name
    # Adam's first step moves each weight by about lr whatever the gradient's scale; the
    # order of the sums moves them by ~1e-6 here (measured 2.2e-6): 0.1 % of a step is far
    # above that and far below a rank that trained on its shard alone (a different gradient)
    for k in one:
        torch.testing.assert_close(two[k], one[k], rtol=0, atol=1e-3 * LR, msg=k)


def _adapter_start(data_dir: Path) -> dict[str, torch.Tensor]:
    """The LoRA weights before the round (the trainer's seeded init, B = 0)."""
    from learner.config import TrainConfig
    from learner.policy.models import load_base
    from learner.train_step import PolicyTrainer

    model, tokenizer = load_base("tiny", cache_dir=MODEL_CACHE)
    trainer = PolicyTrainer(model, tokenizer.pad_token_id, TrainConfig(learning_rate=LR))
    trainer.model.save_pretrained(data_dir / "start")
    return load_file(data_dir / "start" / "adapter_model.safetensors")


KILLS = {
    # crash point: (the rank it kills, what a survivor says)
    "rank1_pg": (1, "arloop learn: a rank of this 2-process launch is gone (during 'pg'"),
    "during_train": (0, "rank 1: rank 0 is gone or silent"),
}


@pytest.mark.parametrize("point", list(KILLS))
def test_kill_9_of_a_rank_mid_round_commits_nothing(point, redis_url, redis_client, tmp_path):
    """rank1_pg: rank 1 dies with a batch in hand, while rank 0 trains its shard of it;
    during_train: rank 0 dies after the update, before its checkpoint."""
    events = _events()
    ids = [e.event_id for e in events]
    for e in events:
        xadd(redis_client, e)
    launched = _launch(redis_url, tmp_path, ARLOOP_CRASH_AT=point)
    output = launched.stdout + launched.stderr
    killed, said = KILLS[point]
    assert launched.returncode != 0, output[-6000:]
    assert re.search(rf"rank\s+: {killed} .*\s+exitcode\s+: -9 ", output), output[-3000:]
    # the survivor said why at once (gloo: connection closed by peer), not at its 30 s
    # timeout, and reached its own exit (the launcher reports the survivors as -15)
    assert said in output, output[-6000:]
    if killed == 1:
        assert "arloop learn: stopped" in output, output[-3000:]
    registry = PolicyRegistry(redis_client)
    assert [v.version for v in registry.versions()] == ["v0"]  # nothing published
    store = Store(tmp_path / "learner" / "store.db")
    assert store.ledger() == {}  # nothing settled: every event still trainable
    assert all(store.has_event(i) for i in ids)
    store.close()

    # a lone learner afterwards takes over and trains every event exactly once
    code, printed, _ = _learn_here(redis_url, tmp_path)
    assert code == 0, printed
    assert [v.version for v in registry.versions()] == ["v0", "v1"]
    assert set(_trained_once(tmp_path, ids).values()) == {"v1"}


def test_ranks_wait_between_rounds_past_the_collective_timeout(redis_url, redis_client, tmp_path):
    """A follower waits for rank 0's next command in a collective; rank 0's heartbeat keeps
    that wait under the 5 s timeout while no round is due (here: 12 s with nothing to learn)."""
    command = [
        *(str(ACCELERATE), "launch", "--multi_gpu", "--num_processes", "2"),
        *("--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no"),
        *("--main_process_port", str(free_port()), "-m", "deploy.cli", "learn"),
    ]
    env = _env(redis_url, tmp_path, ARLOOP_COLLECTIVE_TIMEOUT_S="5")
    with subprocess.Popen(
        command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    ) as launch:
        try:
            deadline = time.monotonic() + 120
            while not redis_client.exists(LEARNER_LEASE):  # rank 0 is up, rank 1 joined
                assert launch.poll() is None and time.monotonic() < deadline, "no learner"
                time.sleep(0.5)
            time.sleep(12)  # idle: more than twice the collective timeout
            assert launch.poll() is None, "the launch died while idle"
            events = _events()
            xadd_all(redis_client, events)
            registry = PolicyRegistry(redis_client)
            while len(registry.versions()) < 2:
                assert launch.poll() is None and time.monotonic() < deadline, "no round"
                time.sleep(0.5)
        finally:
            launch.send_signal(signal.SIGTERM)
            output = launch.communicate(timeout=60)[0]
    assert "rank 1: trained weights" in output, output[-4000:]
    assert "gone" not in output and "silent past" not in output, output[-4000:]
    assert set(_trained_once(tmp_path, [e.event_id for e in events]).values()) == {"v1"}


def test_verified_subrounds_replay_on_rank_0_and_train_on_both(redis_url, redis_client, tmp_path):
    """A labelled prompt is replayed through the tutoring pack's tools from rank 0's weights
    (no collective while it samples) and its groups train on both ranks."""
    events = []
    for i in range(4):
        t = trajectory(answer="#### 42" if i % 2 else "#### 40", logprobs=True, user=f"u{i}")
        events += [t, feedback(t.event_id, "thumbs", 1 if i % 2 else -1, user=f"u{i}")]
    for e in events:
        xadd(redis_client, e)
    launched = _launch(
        redis_url, tmp_path, ARLOOP_LABEL_PACKS='["tutoring"]', ARLOOP_POLICY_MAX_TOKENS="16"
    )
    output = launched.stdout + launched.stderr
    assert launched.returncode == 0, output[-6000:]
    metrics = PolicyRegistry(redis_client).get("v1").metrics
    assert metrics["labels/replayed"] == 1, metrics
    digests = dict(re.findall(r"rank (\d): trained weights sha256 ([0-9a-f]{16})", output))
    assert set(digests) == {"0", "1"} and digests["0"] == digests["1"], output[-4000:]
    assert set(_trained_once(tmp_path, [e.event_id for e in events]).values()) == {"v1"}


def test_full_finetuning_under_ddp_keeps_the_ranks_equal(redis_url, redis_client, tmp_path):
    """Every weight trainable (DDP holds the whole model on each rank; FSDP is not wired up)."""
    events = _events()
    for e in events:
        xadd(redis_client, e)
    launched = _launch(redis_url, tmp_path, ARLOOP_TRAIN__FULL_FINETUNE="true")
    output = launched.stdout + launched.stderr
    assert launched.returncode == 0, output[-6000:]
    assert PolicyRegistry(redis_client).get("v1").checkpoint_kind == "full"
    digests = dict(re.findall(r"rank (\d): trained weights sha256 ([0-9a-f]{16})", output))
    assert set(digests) == {"0", "1"} and digests["0"] == digests["1"], output[-4000:]
    assert set(_trained_once(tmp_path, [e.event_id for e in events]).values()) == {"v1"}
