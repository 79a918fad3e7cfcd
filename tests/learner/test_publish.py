import json
from pathlib import Path

import pytest

from learner.policy.models import checkpoint_path
from learner.policy.registry import CHAMPION, PolicyVersion, VersionStatus
from learner.publish import (
    CheckpointWriteError,
    checkpoint_uri,
    recover,
    register,
    write_checkpoint,
)
from learner.rounds import run_round
from learner.store import CommittedVersion
from learner.trajectory_source import TrajectorySource
from tests.learner.learner_events import feedback, trajectory, xadd
from tests.learner.learner_fixtures import tiny_round_plan


def _save_files(folder: Path) -> None:
    """A LoRA checkpoint's files as promotion checks them (`checkpoint_problem`)."""
    (folder / "adapter_config.json").write_text("{}")
    (folder / "adapter_model.safetensors").write_bytes(b"weights")


def _committed(store, tmp_path, version="v1", parent="v0") -> CommittedVersion:
    path = write_checkpoint(tmp_path / "checkpoints", version, _save_files, {"version": version})
    manifest = {
        "version": version,
        "parent": parent,
        "base_model": "tiny",
        "kind": "lora",
        "created_at": 1.0,
        "metrics": {"loss": 0.5},
        "trained_event_ids": ["a", "b"],
    }
    c = CommittedVersion(version, parent, path, manifest, registered=False)
    store.commit_version(c, ["a", "b"])
    return c


def test_checkpoint_is_renamed_into_place_with_its_manifest(tmp_path):
    path = write_checkpoint(tmp_path / "ck", "v3", _save_files, {"version": "v3"})
    assert path == tmp_path / "ck" / "v3"
    assert sorted(p.name for p in (tmp_path / "ck").iterdir()) == ["v3"]  # no .partial left
    assert json.loads((path / "manifest.json").read_text()) == {"version": "v3"}
    assert checkpoint_path(checkpoint_uri(tmp_path / "a dir" / "v3")) == tmp_path / "a dir" / "v3"


def test_a_failing_save_leaves_no_folder(tmp_path):
    def broken(folder: Path) -> None:
        (folder / "half").write_bytes(b"x")
        raise OSError(28, "No space left on device")

    with pytest.raises(CheckpointWriteError, match="No space left"):
        write_checkpoint(tmp_path / "ck", "v1", broken, {})
    assert list((tmp_path / "ck").iterdir()) == []


def test_a_checkpoint_write_that_fails_leaves_the_champion_where_it_was(
    redis_client, store, registry, tmp_path
):
    t = trajectory(logprobs=True)
    fb = feedback(t.event_id)
    for e in (t, fb):
        xadd(redis_client, e)
    source = TrajectorySource(redis_client, store, "learner-1", block_ms=10)
    source.ensure_groups()
    while not source.poll().caught_up:
        pass
    (tmp_path / "checkpoints").write_text("a file where the checkpoint folder should be")
    with pytest.raises(CheckpointWriteError, match="cannot write checkpoint"):
        run_round(store, registry, tiny_round_plan(tmp_path))
    assert registry.resolve(CHAMPION) == "v0" and [v.version for v in registry.versions()] == ["v0"]
    assert store.ledger() == {} and store.committed_versions() == []
    (tmp_path / "checkpoints").unlink()  # the operator fixes the disk: the episode trains then
    result = run_round(store, registry, tiny_round_plan(tmp_path))
    assert result.version == "v2"  # v1's number was taken by the failed write: never reused
    assert registry.resolve(CHAMPION) == "v2" and store.ledger() == {
        t.event_id: "v2",
        fb.event_id: "v2",
    }


def test_recover_registers_committed_versions_and_removes_uncommitted_ones(
    store, registry, tmp_path
):
    registry.next_version()  # v1 is the number the crashed learner took
    committed = _committed(store, tmp_path)
    write_checkpoint(tmp_path / "checkpoints", "v2", _save_files, {})  # never committed
    (tmp_path / "checkpoints" / "v3.partial").mkdir()  # crashed mid-write
    rec = recover(store, registry, tmp_path / "checkpoints", "test")
    assert [p.version for p in rec.registered] == ["v1"] and rec.registered[0].champion
    assert sorted(rec.removed) == ["v2", "v3.partial"]
    assert [p.name for p in (tmp_path / "checkpoints").iterdir()] == ["v1"]
    record = registry.get("v1")
    assert checkpoint_path(record.checkpoint_uri) == committed.checkpoint.resolve()
    assert registry.resolve(CHAMPION) == "v1" and store.committed_versions()[0].registered
    again = recover(store, registry, tmp_path / "checkpoints", "test")
    assert again.registered == [] and again.removed == []  # idempotent


def test_a_moved_champion_is_reported_and_the_version_stays_published(store, registry, tmp_path):
    other = PolicyVersion(
        version=registry.next_version(),
        parent="v0",
        base_model="tiny",
        checkpoint_uri="file:///elsewhere",
        checkpoint_kind="lora",
    )
    registry.publish(other)
    registry.promote(other.version, expect="v0", reason="operator", actor="ops")
    registry.next_version()
    published = register(store, registry, _committed(store, tmp_path, "v2"), "test")
    assert not published.champion and "another writer" in published.conflict
    assert registry.exists("v2") and registry.resolve(CHAMPION) == "v1"


def test_with_the_gate_off_a_version_whose_checkpoint_is_gone_stays_ready(
    store, registry, tmp_path
):
    registry.next_version()
    committed = _committed(store, tmp_path)
    (committed.checkpoint / "adapter_config.json").unlink()  # lost after the commit
    published = register(store, registry, committed, "test")
    assert not published.champion and "has no adapter_config.json" in published.conflict
    assert registry.get("v1").status is VersionStatus.READY
    assert registry.resolve(CHAMPION) == "v0"


def test_recover_finishes_a_register_the_crash_cut_short(store, registry, tmp_path):
    registry.next_version()
    committed = _committed(store, tmp_path)
    register(store, registry, committed, "test", promote=False)  # crashed before the promote:
    store.db.execute("UPDATE versions SET registered = 0")  # as if before mark_registered
    assert registry.get("v1").status is VersionStatus.READY
    rec = recover(store, registry, tmp_path / "checkpoints", "test")
    assert [p.version for p in rec.registered] == ["v1"] and rec.registered[0].champion
    assert registry.aliases() == {CHAMPION: "v1"}
    assert registry.get("v1").status is VersionStatus.CHAMPION
    assert registry.get("v0").status is VersionStatus.RETIRED
    store.db.execute("UPDATE versions SET registered = 0")  # crashed after the promote
    again = recover(store, registry, tmp_path / "checkpoints", "test")
    assert again.registered[0].champion and registry.get("v1").status is VersionStatus.CHAMPION
