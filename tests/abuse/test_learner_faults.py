"""The learner as a failing machine meets it: Redis rolled back to an older append-only file,
two learners on one Redis, a torchrun launch (rank 0 alone learns), a champion whose checkpoint cannot load.

Real redis-servers and real learner rounds on the tiny model, on loopback, bounded in time.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import redis
from rich.console import Console

from agents.events import LEARNER_LEASE, STREAM_POLICY, RegistryRewound, decode
from deploy.embedded_redis import free_port, start_redis
from deploy.learn.loop import Learner
from deploy.learn.metrics import serve_metrics
from deploy.learn.settings import LearnerSettings
from learner.policy.registry import CHAMPION, PolicyRegistry
from learner.store import Store
from tests.learner.learner_events import feedback, trajectory, xadd
from tests.model_cache import MODEL_CACHE

REPO = Path(__file__).resolve().parents[2]


def settings(redis_url: str, data_dir: Path, **extra) -> LearnerSettings:
    return LearnerSettings(
        _env_file=None,
        redis_url=redis_url,
        data_dir=data_dir,
        model_cache=MODEL_CACHE,
        base_model="tiny",
        min_episodes=1,
        read_block_ms=50,
        train={"learning_rate": 0.05},
        metrics_port=0,
        eval_gate=False,  # these rounds publish straight to champion
        **extra,
    )


def seed(client: redis.Redis, n: int, tag: str) -> list[str]:
    ids = []
    for i in range(n):
        t = trajectory(
            answer="The answer is 42." if i % 2 else "no", logprobs=True, user=f"{tag}{i}"
        )
        f = feedback(t.event_id, "thumbs", 1 if i % 2 else -1, user=f"{tag}{i}")
        for e in (t, f):
            xadd(client, e)
            ids.append(e.event_id)
    return ids


def learn_once(redis_url: str, data_dir: Path) -> tuple[int, str, dict[str, str]]:
    """One round in this process: exit code, what it printed, the ledger after."""
    out = io.StringIO()
    learner = Learner(settings(redis_url, data_dir), Console(file=out, width=300))
    try:
        code = learner.run(once=True)
        return code, out.getvalue(), learner.store.ledger()
    finally:
        learner.store.close()


@pytest.fixture
def own_redis(tmp_path):
    server = start_redis(tmp_path / "redis")
    yield server
    server.stop()


def test_a_rewound_registry_is_said_and_its_lost_events_train_again(own_redis, tmp_path):
    """v1 is published, Redis's files are saved, v2 is published, then Redis comes back from
    the saved files (as a restore or a failover to a lagging replica would): the registry has
    v1 as champion and its counter at 1, while the learner's store has v2 registered."""
    data = tmp_path / "data"
    client = redis.Redis.from_url(own_redis.url)
    first = seed(client, 2, "a")
    assert learn_once(own_redis.url, data)[0] == 0
    own_redis.stop()
    snapshot = tmp_path / "snapshot"
    shutil.copytree(own_redis.directory, snapshot)
    own_redis.process = start_redis(own_redis.directory, own_redis.port).process
    second = seed(client, 2, "b")
    code, _, ledger = learn_once(own_redis.url, data)
    assert code == 0 and set(ledger) == set(first + second)
    assert {ledger[i] for i in second} == {"v2"}
    own_redis.stop()
    shutil.rmtree(own_redis.directory)
    shutil.copytree(snapshot, own_redis.directory)  # the older append-only file
    own_redis.process = start_redis(own_redis.directory, own_redis.port).process
    client = redis.Redis.from_url(own_redis.url)
    assert PolicyRegistry(client).aliases()[CHAMPION] == "v1"  # serving went back

    third = seed(client, 2, "c")
    code, out, ledger = learn_once(own_redis.url, data)
    assert code == 0, out
    assert "Redis was rewound: the registry no longer has v2" in out
    assert "ARLOOP_DATA_DIR is writable" not in out
    assert "4 events of v2 are trainable again" in out
    assert set(ledger) == set(first + second + third)  # the lost events trained once more
    assert {ledger[i] for i in second + third} == {"v2"} and {ledger[i] for i in first} == {"v1"}
    registry = PolicyRegistry(client)
    assert registry.aliases()[CHAMPION] == "v2"
    [aside] = (data / "checkpoints-lost").iterdir()
    assert (aside / "v2" / "manifest.json").is_file()  # the lost version, kept aside
    events = [decode(f) for _, f in client.xrange(STREAM_POLICY)]
    [said] = [e for e in events if isinstance(e, RegistryRewound)]
    assert (said.lost_versions, said.champion, said.retrainable_events) == (["v2"], "v1", 4)
    client.close()


def _learner_process(redis_url: str, data_dir: Path, log: Path, **env: str) -> subprocess.Popen:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("ARLOOP_")}
    environ |= {
        "ARLOOP_REDIS_URL": redis_url,
        "ARLOOP_DATA_DIR": str(data_dir),
        "ARLOOP_MODEL_CACHE": str(MODEL_CACHE),
        "ARLOOP_BASE_MODEL": "tiny",
        "ARLOOP_MIN_EPISODES": "4",
        "ARLOOP_READ_BLOCK_MS": "50",
        "ARLOOP_METRICS_PORT": "0",
        "ARLOOP_EVAL_GATE": "false",
        "ARLOOP_LEASE_S": "3",
        "ARLOOP_TRAIN__LEARNING_RATE": "0.05",
        "ARLOOP_ROUND__FEEDBACK_WINDOW_S": "0",
        "PYTHONUNBUFFERED": "1",
        **env,
    }
    handle = open(log, "w")
    return subprocess.Popen(
        [sys.executable, "-m", "deploy.learn.runner"],
        cwd=REPO,
        env=environ,
        stdout=handle,
        stderr=subprocess.STDOUT,
    )


def _wait_for(path: Path, text: str, timeout: float = 90.0) -> None:
    deadline = time.monotonic() + timeout
    while text not in path.read_text():
        assert time.monotonic() < deadline, f"{text!r} never came:\n{path.read_text()[-3000:]}"
        time.sleep(0.1)


def test_two_learners_one_lease_the_second_waits_then_takes_over(redis_url, redis_client, tmp_path):
    """Both use the default consumer name, as two replicas would. The second reads nothing
    while the first holds the lease: every run is trained by the one that read it, once."""
    logs = {n: tmp_path / f"{n}.log" for n in "ab"}
    first = _learner_process(redis_url, tmp_path / "a", logs["a"])
    second = None
    try:
        _wait_for(logs["a"], "holding the learner lease (fencing token 1)")
        second = _learner_process(redis_url, tmp_path / "b", logs["b"])
        _wait_for(logs["b"], "another learner holds the lease: learner-1@")
        _wait_for(logs["b"], "waiting to take over")
        ids = seed(redis_client, 4, "u")
        _wait_for(logs["a"], "v1 <- v0")
        first.send_signal(signal.SIGKILL)  # dies holding the lease: the second waits it out
        first.wait()
        _wait_for(logs["b"], "holding the learner lease (fencing token 2)", timeout=60)
        later = seed(redis_client, 4, "w")
        _wait_for(logs["b"], "v2 <- v1")
    finally:
        for proc in (first, second):
            if proc is not None and proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                proc.wait(timeout=60)
    store_a = Store(tmp_path / "a" / "learner" / "store.db")
    store_b = Store(tmp_path / "b" / "learner" / "store.db")
    try:
        assert set(store_a.ledger()) == set(ids) and set(store_b.ledger()) == set(later)
    finally:
        store_a.close()
        store_b.close()
    versions = PolicyRegistry(redis_client).versions()
    assert [(v.version, v.status.value) for v in versions] == [
        ("v0", "retired"),
        ("v1", "retired"),
        ("v2", "champion"),
    ]
    assert "Traceback" not in logs["a"].read_text() + logs["b"].read_text()


def test_a_stale_learner_is_fenced_out_of_the_registry(redis_url, redis_client, tmp_path):
    """A learner whose lease another took (it paused past it) publishes nothing."""
    seed(redis_client, 2, "u")
    out = io.StringIO()
    learner = Learner(settings(redis_url, tmp_path), Console(file=out, width=300))
    learner.start(once=True)
    while not learner.poll():  # the events are in its store
        pass
    redis_client.set(LEARNER_LEASE, "99|learner-1@elsewhere:1", px=30_000)
    try:
        assert not learner._round()
        assert "lease is gone (now held by learner-1@elsewhere:1)" in out.getvalue()
        assert [v.version for v in learner.registry.versions()] == ["v0"]
        assert learner.store.ledger() == {}  # the events stay trainable
    finally:
        learner.store.close()


def test_a_torchrun_launch_learns_once_on_rank_0(redis_url, redis_client, tmp_path):
    """`torchrun --nproc_per_node 2` used to run the whole learner twice: a UNIQUE failure in
    one, a champion without adapter_config.json from the other. Now rank 0 learns and rank 1
    trains its shard of each batch (tests/deploy/learn/test_accelerate.py has the rest)."""
    ids = seed(redis_client, 2, "u")
    environ = {k: v for k, v in os.environ.items() if not k.startswith("ARLOOP_")}
    environ |= {
        "ARLOOP_REDIS_URL": redis_url,
        "ARLOOP_DATA_DIR": str(tmp_path),
        "ARLOOP_MODEL_CACHE": str(MODEL_CACHE),
        "ARLOOP_BASE_MODEL": "tiny",
        "ARLOOP_MIN_EPISODES": "1",
        "ARLOOP_TRAIN__LEARNING_RATE": "0.05",
        "ARLOOP_METRICS_PORT": "0",
        "ARLOOP_EVAL_GATE": "false",
        "ARLOOP_COLLECTIVE_TIMEOUT_S": "30",
        "OMP_NUM_THREADS": "1",
    }
    done = subprocess.run(
        [
            *(sys.executable, "-m", "torch.distributed.run", "--standalone"),
            *("--nproc_per_node", "2", "-m", "deploy.learn.runner", "--once"),
        ],
        cwd=REPO,
        env=environ,
        capture_output=True,
        text=True,
        timeout=300,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-4000:]
    assert "rank 1: following rank 0" in output and "rank 1: trained weights" in output
    assert "UNIQUE constraint" not in output
    registry = PolicyRegistry(redis_client)
    assert registry.aliases()[CHAMPION] == "v1" and len(registry.versions()) == 2
    assert (tmp_path / "checkpoints" / "v1" / "adapter_config.json").is_file()
    store = Store(tmp_path / "learner" / "store.db")
    assert set(store.ledger()) == set(ids)
    store.close()


def test_healthz_reports_a_champion_that_cannot_load(redis_url, redis_client, tmp_path):
    seed(redis_client, 2, "u")
    out = io.StringIO()
    learner = Learner(settings(redis_url, tmp_path), Console(file=out, width=300))
    server = serve_metrics(learner.telemetry, "127.0.0.1", free_port())
    url = f"http://127.0.0.1:{server.server_address[1]}/healthz"
    try:
        assert learner.run(once=True) == 0, out.getvalue()
        learner.telemetry.refresh(force=True)
        assert httpx.get(url).status_code == 200
        (tmp_path / "checkpoints" / "v1" / "adapter_config.json").unlink()
        learner.telemetry.refresh(force=True)
        health = httpx.get(url)
        assert health.status_code == 503
        body = health.json()
        assert (
            body["status"] == "unhealthy"
            and "has no adapter_config.json" in body["champion_problem"]
        )
        status = json.loads(redis_client.get("arloop:learner:status"))
        assert "adapter_config.json" in status["champion_problem"]  # the dashboard sees it
    finally:
        server.shutdown()
        learner.store.close()
