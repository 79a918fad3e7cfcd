"""Publishing a trained policy: checkpoint on disk, then the ledger, then the registry.

The order is the crash-safety argument:
1. the checkpoint is written to `<version>.partial`, fsynced, and renamed to `<version>`
   (a crash here leaves a folder no ledger row names: removed on restart, events retrained);
   its digest is taken, and with object storage (`upload_to`, ARLOOP_CHECKPOINT_URI=s3://...)
   the folder is uploaded under `<upload_to>/<version>` (a crash after the upload leaves
   objects no ledger row names: never served, as no registry record names them);
2. one store transaction commits the version row and the ledger of the events it learned from
   (after this the events are trained, whatever happens next);
3. the registry learns of the version (READY), with its checkpoint's URI and digest
   (`learner.policy.storage`): publishing stops there. With no eval gate
   configured (`promote`), the release rule for that case (`learner.gate.release.release_ungated`,
   through the one `promote` and its checks) moves `champion` from the parent to it before the
   store marks the version registered; with a gate, the release flow moves the aliases
   (`learner/gate/control.py`). A crash before this is finished by `recover` on restart.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from learner.crashpoints import crash_point
from learner.gate.release import release_ungated
from learner.policy.models import REQUIRED_FILES
from learner.policy.registry import PolicyRegistry, PolicyVersion
from learner.policy.storage import folder_digest, upload_checkpoint, version_uri
from learner.store import CommittedVersion, Store

log = logging.getLogger(__name__)

MANIFEST = "manifest.json"
PARTIAL = ".partial"


class CheckpointWriteError(RuntimeError):
    """The checkpoint could not be written; nothing was committed and the registry is unchanged."""


@dataclass(frozen=True)
class Published:
    """Where a version ended up: registered; champion when promoted and no other writer won."""

    version: str
    parent: str | None
    checkpoint: Path
    champion: bool
    conflict: str | None = None


def checkpoint_uri(path: Path) -> str:
    """`file:///abs/path`, as `learner.policy.models.checkpoint_path` reads it back."""
    return path.resolve().as_uri()


def write_checkpoint(
    checkpoints_dir: Path, version: str, save: Callable[[Path], None], manifest: dict[str, Any]
) -> Path:
    """Write `<version>.partial` (`save` + manifest), fsync it, rename it to `<version>`."""
    final = checkpoints_dir / version
    partial = checkpoints_dir / (version + PARTIAL)
    if final.exists():
        raise CheckpointWriteError(
            f"checkpoint folder {final} exists already: the registry named the new version "
            f"{version} again, so its version counter went back (Redis restored from an older "
            "snapshot, or failed over to a lagging replica). The learner reconciles this at "
            "the next round; the events stay trainable"
        )
    try:
        checkpoints_dir.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir()
        save(partial)
        (partial / MANIFEST).write_text(_json(manifest))
        _fsync_tree(partial)
        os.replace(partial, final)
        _fsync_dir(checkpoints_dir)
    except OSError as exc:
        shutil.rmtree(partial, ignore_errors=True)
        raise CheckpointWriteError(
            f"cannot write checkpoint {version} under {checkpoints_dir}: {exc}. "
            "Check that ARLOOP_DATA_DIR is writable and has free space."
        ) from exc
    return final


def publish_version(
    store: Store,
    registry: PolicyRegistry,
    save: Callable[[Path], None],
    *,
    checkpoints_dir: Path,
    parent: PolicyVersion,
    kind: str,
    metrics: dict[str, float],
    trained: Sequence[str],
    let_go: dict[str, Sequence[str]],
    meta: dict[str, Any],
    actor: str,
    promote: bool = True,
    upload_to: str | None = None,
) -> Published:
    """Checkpoint, commit the ledger, register (and promote): the three steps in their order.
    `upload_to` (`s3://bucket/prefix`): the checkpoint is uploaded there before the commit.

    Fenced (nothing written) when this learner's lease is gone; CheckpointWriteError when the
    folder the registry's next name points at exists already (the registry went back: see
    `learner.reconcile`) or the written checkpoint lacks a file it cannot load without."""
    registry.check_fence()
    version = registry.next_version()
    manifest = {
        "version": version,
        "parent": parent.version,
        "base_model": parent.base_model,
        "kind": kind,
        "created_at": time.time(),
        "metrics": metrics,
        "trained_event_ids": list(trained),
    }
    path = write_checkpoint(checkpoints_dir, version, save, manifest)
    missing = [n for n in REQUIRED_FILES.get(kind, ()) if not (path / n).is_file()]
    if missing:
        shutil.rmtree(path, ignore_errors=True)
        raise CheckpointWriteError(
            f"checkpoint {version} was written without {', '.join(missing)}: it could never "
            "load, so it is not published (the round's events stay trainable)"
        )
    stored = _store(path, version, upload_to)
    crash_point("after_checkpoint")
    committed = CommittedVersion(
        version, parent.version, path, {**manifest, **stored}, registered=False
    )
    try:
        store.commit_version(committed, trained, let_go, meta)
    except BaseException:
        shutil.rmtree(path, ignore_errors=True)  # never leave a checkpoint no ledger names
        raise
    crash_point("after_commit")
    return register(store, registry, committed, actor, promote=promote)


def register(
    store: Store,
    registry: PolicyRegistry,
    committed: CommittedVersion,
    actor: str,
    *,
    promote: bool = True,
) -> Published:
    """Put a committed version in the registry, READY, and (`promote`) make it champion (idempotent)."""
    m = committed.manifest
    if not registry.exists(committed.version):
        record = PolicyVersion(
            version=committed.version,
            parent=committed.parent,
            base_model=m["base_model"],
            checkpoint_uri=m.get("checkpoint_uri") or checkpoint_uri(committed.checkpoint),
            checkpoint_digest=m.get("checkpoint_digest"),
            checkpoint_kind=m["kind"],
            created_at=m["created_at"],
            metrics=m["metrics"],
        )
        registry.publish(record, trained_events=len(m["trained_event_ids"]))
    champion, conflict = _promote(registry, committed, actor) if promote else (False, None)
    store.mark_registered(committed.version)
    return Published(committed.version, committed.parent, committed.checkpoint, champion, conflict)


def _store(path: Path, version: str, upload_to: str | None) -> dict[str, str]:
    """The checkpoint's digest, uploaded when `upload_to`: what the registry will record."""
    stored = {"checkpoint_digest": folder_digest(path)}
    if upload_to:
        uri = version_uri(upload_to, version)
        try:
            upload_checkpoint(path, uri)
        except Exception as exc:  # botocore: no endpoint, denied, no bucket, ...
            shutil.rmtree(path, ignore_errors=True)
            raise CheckpointWriteError(
                f"cannot upload checkpoint {version} to {uri}: {exc}. Check "
                "ARLOOP_CHECKPOINT_URI, AWS_ENDPOINT_URL and the credentials "
                "(the round's events stay trainable)"
            ) from exc
        stored["checkpoint_uri"] = uri
    return stored


def _promote(
    registry: PolicyRegistry, committed: CommittedVersion, actor: str
) -> tuple[bool, str | None]:
    """Release the version with the gate off; (champion, why not)."""
    why = release_ungated(registry, committed.version, committed.parent, actor=actor)
    if why:
        log.warning("%s published but not champion: %s", committed.version, why)
    return why is None, why


@dataclass(frozen=True)
class Recovery:
    registered: list[Published]
    removed: list[str]


def recover(
    store: Store, registry: PolicyRegistry, checkpoints_dir: Path, actor: str, promote: bool = True
) -> Recovery:
    """On start: register committed-but-unregistered versions, delete uncommitted checkpoints."""
    committed = store.committed_versions()
    registered = [
        register(store, registry, c, actor, promote=promote) for c in committed if not c.registered
    ]
    known = {c.checkpoint.name for c in committed}
    removed = []
    if checkpoints_dir.is_dir():
        for child in sorted(checkpoints_dir.iterdir()):
            if child.name not in known:
                shutil.rmtree(child) if child.is_dir() else child.unlink()
                removed.append(child.name)
    if removed:
        log.warning("removed uncommitted checkpoints: %s", ", ".join(removed))
    return Recovery(registered, removed)


def _fsync_tree(folder: Path) -> None:
    for path in folder.rglob("*"):
        if path.is_file():
            with open(path, "rb") as f:
                os.fsync(f.fileno())
    _fsync_dir(folder)


def _fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _json(value: Any) -> str:
    return json.dumps(value, indent=2, sort_keys=True)
