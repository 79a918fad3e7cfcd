"""Checkpoints on object storage, against a real S3-compatible server (moto's, its own process):
a round's version uploaded and served, a tampered object refused, local folders as before."""

import shutil
import time
from dataclasses import replace
from pathlib import Path

import httpx
import pytest

from learner.policy.registry import CHAMPION, VersionStatus
from learner.policy.storage import DigestMismatch, fetch_checkpoint, folder_digest
from learner.publish import publish_version
from learner.rounds import run_round
from learner.trajectory_source import TrajectorySource
from tests.deploy.policy_server.support import make_lora, running_server, tiny_settings
from tests.learner.learner_events import feedback, trajectory, xadd
from tests.learner.learner_fixtures import tiny_round_plan
from tests.model_cache import MODEL_CACHE
from tests.s3_server import s3_client


def _ask(base: str, model: str = "arloop") -> httpx.Response:
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    return httpx.post(f"{base}/chat/completions", json=body, timeout=60)


def _first_response_of(base: str, version: str, timeout: float = 60.0) -> float:
    """Ask until the champion answering is `version`; the monotonic time of that answer."""
    deadline = time.monotonic() + timeout
    while True:
        r = _ask(base)
        if r.status_code == 200 and r.json()["system_fingerprint"] == version:
            return time.monotonic()
        if time.monotonic() > deadline:
            raise AssertionError(f"{version} never answered (last: {r.text[:200]})")
        time.sleep(0.02)


def _publish(store, registry, tmp_path: Path, seed: int, **kwargs):
    """A LoRA over the tiny base published as a round publishes (`publish_version`)."""
    return publish_version(
        store,
        registry,
        lambda folder: make_lora(folder, seed=seed),
        checkpoints_dir=tmp_path / "checkpoints",
        parent=registry.get(registry.resolve(CHAMPION)),
        kind="lora",
        metrics={},
        trained=[],
        let_go={},
        meta={},
        actor="test",
        **kwargs,
    )


def _health(base: str) -> dict:
    return httpx.get(base.removesuffix("/v1") + "/healthz").json()


def test_a_rounds_version_on_s3_is_served_once_its_digest_checks(
    redis_client, redis_url, store, registry, s3_bucket, tmp_path
):
    t = trajectory(logprobs=True)
    for event in (t, feedback(t.event_id)):
        xadd(redis_client, event)
    source = TrajectorySource(redis_client, store, "learner-1", block_ms=10)
    source.ensure_groups()
    while not source.poll().caught_up:
        pass
    prefix = f"s3://{s3_bucket}/arloop/checkpoints"
    with running_server(tiny_settings(redis_url)) as base:
        assert _ask(base).json()["system_fingerprint"] == "v0"
        result = run_round(store, registry, replace(tiny_round_plan(tmp_path), upload_to=prefix))
        published = time.monotonic()
        served = _first_response_of(base, result.version)
        record = registry.get(result.version)
        assert record.checkpoint_uri == f"{prefix}/{result.version}"
        assert record.checkpoint_digest == folder_digest(result.published.checkpoint)
        listed = s3_client().list_objects_v2(Bucket=s3_bucket)["Contents"]
        names = {o["Key"].rsplit("/", 1)[-1] for o in listed}
        assert {"adapter_config.json", "adapter_model.safetensors", "manifest.json"} <= names
        assert _health(base)["digests"][result.version] == record.checkpoint_digest[:23]
    fetched = MODEL_CACHE / "checkpoints" / f"{result.version}-{record.checkpoint_digest[7:23]}"
    assert folder_digest(fetched) == record.checkpoint_digest
    print(f"round's version on s3: published -> first response {served - published:.2f} s")


def test_a_tampered_object_is_refused_naming_the_version_and_both_digests(
    redis_client, redis_url, store, registry, s3_bucket, tmp_path
):
    prefix = f"s3://{s3_bucket}/ck"
    published = _publish(store, registry, tmp_path, seed=1, promote=False, upload_to=prefix)
    version, record = published.version, registry.get(published.version)
    other = make_lora(tmp_path / "other", seed=2)  # a valid adapter: only the digest tells
    key = f"ck/{version}/adapter_model.safetensors"
    s3_client().upload_file(str(other / "adapter_model.safetensors"), s3_bucket, key)
    tampered = shutil.copytree(published.checkpoint, tmp_path / "tampered")
    shutil.copy(other / "adapter_model.safetensors", tampered / "adapter_model.safetensors")
    got, expected = folder_digest(tampered), record.checkpoint_digest
    assert got != expected

    with pytest.raises(DigestMismatch) as caught:
        fetch_checkpoint(record, tmp_path / "cache")
    assert version in str(caught.value) and got in str(caught.value)
    assert expected in str(caught.value)
    assert not list((tmp_path / "cache" / "checkpoints").iterdir())  # nothing left to load

    with running_server(tiny_settings(redis_url)) as base:
        registry.promote(version, expect="v0", reason="test", actor="test")
        deadline = time.monotonic() + 60
        while registry.get(version).status is not VersionStatus.BROKEN:
            assert time.monotonic() < deadline, "the tampered version was never refused"
            time.sleep(0.05)
        error = registry.get(version).error
        assert "DigestMismatch" in error and version in error
        assert got in error and expected in error
        assert _ask(base).json()["system_fingerprint"] == "v0"
        assert _health(base)["serving"] == {CHAMPION: "v0"}
        r = _ask(base, model=f"arloop@{version}")
        assert r.status_code == 404 and "broken" in r.json()["error"]["message"]


def test_local_checkpoints_work_as_before_and_their_digest_is_recorded(
    redis_url, store, registry, tmp_path
):
    with running_server(tiny_settings(redis_url)) as base:
        published = _publish(store, registry, tmp_path, seed=3)
        _first_response_of(base, published.version)
    record = registry.get(published.version)
    assert record.checkpoint_uri == published.checkpoint.resolve().as_uri()
    assert record.checkpoint_digest == folder_digest(published.checkpoint)


def test_publish_to_first_response_on_s3_with_the_digest_checked(
    redis_url, store, registry, s3_bucket, tmp_path
):
    """The figure: from `publish_version` (write, digest, upload, commit, READY, champion) to
    the first answer of the new version, fetched and checked by a running policy server."""
    prefix = f"s3://{s3_bucket}/ck"
    times = []
    with running_server(tiny_settings(redis_url)) as base:
        for seed in (11, 12, 13):
            started = time.monotonic()
            published = _publish(store, registry, tmp_path, seed=seed, upload_to=prefix)
            done = time.monotonic()
            served = _first_response_of(base, published.version)
            times.append((published.version, done - started, served - done, served - started))
    for version, publish_s, serve_s, total_s in times:
        print(
            f"{version}: publish to s3 {publish_s:.2f} s, then first response {serve_s:.2f} s: "
            f"publish -> first response {total_s:.2f} s (tiny model, LoRA, digest checked)"
        )
    assert all(total < 60 for *_, total in times)


def test_the_gates_figures_read_an_s3_version_fetched_and_checked(
    store, registry, s3_bucket, tmp_path
):
    from learner.gate.figures import gather

    published = _publish(
        store, registry, tmp_path, seed=4, promote=False, upload_to="s3://" + s3_bucket
    )
    shutil.rmtree(published.checkpoint)  # the gate reads the bucket, not the learner's folder
    evidence, _, training = gather(
        registry,
        store,
        published.version,
        [],
        max_user_share=1.0,
        ope_runs=0,
        min_ess=1.0,
        model_cache=tmp_path / "cache",
    )
    assert evidence.source_scores == {} and training["trained_runs"] == 0
    record = registry.get(published.version)
    assert (
        tmp_path / "cache" / "checkpoints" / f"{published.version}-{record.checkpoint_digest[7:23]}"
    ).is_dir()


def test_the_learners_setting_names_where_its_rounds_upload(tmp_path):
    from pydantic import ValidationError

    from deploy.learn.plan import round_plan
    from deploy.learn.settings import LearnerSettings

    s = LearnerSettings(
        data_dir=tmp_path, checkpoint_uri="s3://b/arloop", eval_gate=False, _env_file=None
    )
    assert round_plan(s).upload_to == "s3://b/arloop"
    plain = LearnerSettings(data_dir=tmp_path, eval_gate=False, _env_file=None)
    assert round_plan(plain).upload_to is None
    with pytest.raises(ValidationError, match="checkpoint_uri"):
        LearnerSettings(data_dir=tmp_path, checkpoint_uri="/mnt/shared", _env_file=None)


def test_a_spoiled_cached_copy_is_fetched_again_not_served(store, registry, s3_bucket, tmp_path):
    published = _publish(
        store, registry, tmp_path, seed=5, promote=False, upload_to="s3://" + s3_bucket
    )
    record = registry.get(published.version)
    folder = fetch_checkpoint(record, tmp_path / "cache")
    assert folder_digest(folder) == record.checkpoint_digest
    (folder / "adapter_model.safetensors").write_bytes(b"spoiled on the server's disk")
    again = fetch_checkpoint(record, tmp_path / "cache")
    assert again == folder and folder_digest(again) == record.checkpoint_digest


CRASHING_PUBLISH = """
import shutil
import sys
from pathlib import Path
import redis
import tests.model_cache
from learner.policy.registry import PolicyRegistry
from learner.publish import publish_version
from tests.deploy.policy_server import support
from tests.deploy.policy_server.support import make_lora
from tests.learner.learner_fixtures import open_store

tmp, url, prefix = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
shutil.rmtree(tests.model_cache.MODEL_CACHE)  # the session's cache, not one of its own
support.MODEL_CACHE = Path(sys.argv[4])
registry = PolicyRegistry(redis.Redis.from_url(url))
publish_version(
    open_store(tmp), registry, lambda folder: make_lora(folder, seed=6),
    checkpoints_dir=tmp / "checkpoints", parent=registry.get("v0"), kind="lora", metrics={},
    trained=[], let_go={}, meta={}, actor="test", upload_to=prefix,
)
"""


def test_a_learner_killed_after_its_commit_registers_the_s3_version_on_restart(
    redis_url, registry, s3_bucket, tmp_path, monkeypatch
):
    import subprocess
    import sys

    from learner.publish import recover
    from tests.learner.learner_fixtures import open_store

    monkeypatch.setenv("ARLOOP_CRASH_AT", "after_commit")
    prefix = f"s3://{s3_bucket}/ck"
    run = [sys.executable, "-c", CRASHING_PUBLISH, str(tmp_path), redis_url, prefix]
    run.append(str(MODEL_CACHE))
    done = subprocess.run(run, capture_output=True, text=True, timeout=120)
    assert done.returncode == -9, done.stderr[-2000:]  # SIGKILLed at the crash point
    assert [v.version for v in registry.versions()] == ["v0"]  # the registry never heard
    store = open_store(tmp_path)
    try:
        (published,) = recover(store, registry, tmp_path / "checkpoints", "test").registered
    finally:
        store.close()
    record = registry.get(published.version)
    assert record.checkpoint_uri == f"{prefix}/{published.version}"
    assert record.checkpoint_digest == folder_digest(tmp_path / "checkpoints" / published.version)
    assert folder_digest(fetch_checkpoint(record, tmp_path / "cache")) == record.checkpoint_digest


def test_an_unreachable_store_is_tried_again_not_marked_broken(
    redis_url, store, registry, s3_bucket, s3_endpoint, tmp_path, monkeypatch
):
    from deploy.embedded_redis import free_port

    published = _publish(
        store, registry, tmp_path, seed=7, promote=False, upload_to="s3://" + s3_bucket
    )
    version = published.version
    with running_server(tiny_settings(redis_url)) as base:
        monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{free_port()}")  # store down
        monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")
        registry.promote(version, expect="v0", reason="test", actor="test")
        deadline = time.monotonic() + 60
        while not any("cannot fetch" in p for p in _health(base)["problems"]):
            assert time.monotonic() < deadline, _health(base)
            time.sleep(0.05)
        (problem,) = _health(base)["problems"]
        assert f"cannot fetch {version}" in problem and "serving v0 instead" in problem
        assert registry.get(version).status is not VersionStatus.BROKEN
        assert _ask(base).json()["system_fingerprint"] == "v0"
        monkeypatch.setenv("AWS_ENDPOINT_URL", s3_endpoint)  # back: the next sync serves it
        _first_response_of(base, version)
    assert registry.get(version).status is not VersionStatus.BROKEN


def test_a_failed_upload_publishes_nothing(store, registry, s3_bucket, tmp_path, monkeypatch):
    from learner.publish import CheckpointWriteError

    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")
    with pytest.raises(CheckpointWriteError, match="cannot upload checkpoint v1 to s3://no-such"):
        _publish(store, registry, tmp_path, seed=8, upload_to="s3://no-such-bucket/ck")
    assert [v.version for v in registry.versions()] == ["v0"]
    assert store.committed_versions() == [] and store.ledger() == {}
    assert list((tmp_path / "checkpoints").iterdir()) == []  # no folder a ledger row lacks
