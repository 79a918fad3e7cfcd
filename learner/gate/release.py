"""Release moves: a gated version becomes the candidate, then champion, or is rejected or rolled back.

Each move is a compare-and-set of an alias in the registry (two learners or operators racing:
one wins, the other gets `AliasConflict`) plus an event on `arloop:policy:events`, so
`arloop policy list` shows who moved what and why. A rejected version never moves `champion`.
"""

from __future__ import annotations

import time
from typing import Any

from agents.events import PolicyAliasMoved, PolicyRejected, PolicyRolledBack
from learner.gate.eval_gate import ERROR, PASS, GateReport
from learner.policy.registry import (
    CANDIDATE,
    CHAMPION,
    AliasConflict,
    PolicyRegistry,
    PolicyVersion,
    VersionStatus,
)

_REQUIRED = {"lora": ("adapter_config.json", "adapter_model.safetensors"), "full": ("config.json",)}


class ReleaseError(RuntimeError):
    """A move that cannot be made; the message says why and what to do."""


def checkpoint_problem(record: PolicyVersion) -> str | None:
    """Why a version's checkpoint cannot be served, or None when its files are in place."""
    if record.status is VersionStatus.BROKEN:
        return f"{record.version} is marked broken: {record.error}"
    if record.checkpoint_uri.startswith("base:"):
        return None
    from learner.policy.models import CheckpointError, checkpoint_path  # torch: only when needed

    try:
        folder = checkpoint_path(record.checkpoint_uri)
    except CheckpointError as exc:
        return str(exc)
    if not folder.is_dir():
        return f"its checkpoint folder {folder} does not exist"
    missing = [n for n in _REQUIRED.get(record.checkpoint_kind, ()) if not (folder / n).is_file()]
    return f"its checkpoint folder {folder} has no {missing[0]}" if missing else None


def record_report(registry: PolicyRegistry, report: GateReport, **extra: Any) -> None:
    """Store the gate's report (JSON + summary) with the version."""
    registry.attach_report(report.version, report.to_dict() | extra)


def reject(registry: PolicyRegistry, report: GateReport) -> None:
    """The gate refused: report stored, status REJECTED, a PolicyRejected event naming why."""
    record_report(registry, report)
    registry.set_status(report.version, VersionStatus.REJECTED, error=report.reason)
    registry.emit(
        PolicyRejected(
            event_id=f"rejected_{report.version}_{_ms()}",
            version=report.version,
            failed=report.failed,
            reason=report.reason,
        )
    )


def open_candidate(registry: PolicyRegistry, version: str, *, actor: str) -> None:
    """`candidate` -> version, only if no candidate is out now (AliasConflict otherwise)."""
    registry.move_alias(CANDIDATE, version, expect="", reason="passed the eval gate", actor=actor)
    registry.set_status(version, VersionStatus.CANDIDATE)


def promote(
    registry: PolicyRegistry, version: str, *, actor: str, reason: str, force: bool = False
) -> str | None:
    """`champion` -> version (compare-and-set against the champion read now); returns the old one."""
    record = registry.get(registry.resolve(version))
    version = record.version
    if record.status is VersionStatus.REJECTED and not force:
        raise ReleaseError(
            f"{version} was rejected ({record.error}); promote it anyway with --force"
        )
    problem = checkpoint_problem(record)
    if problem:
        raise ReleaseError(f"cannot promote {version}: {problem}")
    current = registry.aliases().get(CHAMPION)
    if current == version:
        raise ReleaseError(f"{version} is already the champion")
    registry.move_alias(CHAMPION, version, expect=current or "", reason=reason, actor=actor)
    registry.set_status(version, VersionStatus.CHAMPION)
    if current:
        registry.set_status(current, VersionStatus.RETIRED)
    if registry.aliases().get(CANDIDATE) == version:
        _clear_candidate(registry, version, reason=f"promoted: {reason}", actor=actor)
    return current


def end_canary(registry: PolicyRegistry, version: str, *, actor: str, reason: str) -> None:
    """Roll a candidate back: `candidate` cleared, the version REJECTED, a PolicyRolledBack event."""
    _clear_candidate(registry, version, reason=f"rolled back: {reason}", actor=actor)
    registry.set_status(version, VersionStatus.REJECTED, error=f"rolled back: {reason}")
    champion = registry.aliases().get(CHAMPION, "")
    registry.emit(
        PolicyRolledBack(
            event_id=f"rollback_{version}_{_ms()}",
            from_version=version,
            to_version=champion,
            reason=reason,
            actor=actor,
        )
    )


def rollback(
    registry: PolicyRegistry, *, to: str | None = None, actor: str, reason: str
) -> tuple[str, str]:
    """`champion` back to `to` (default: the champion before it); (from, to). Champion unchanged
    and ReleaseError when the target's checkpoint is gone."""
    current = registry.resolve(CHAMPION)
    target = registry.resolve(to) if to else previous_champion(registry, current)
    if target == current:
        raise ReleaseError(f"{target} is already the champion")
    problem = checkpoint_problem(registry.get(target))
    if problem:
        raise ReleaseError(
            f"cannot roll back to {target}: {problem}. The champion stays "
            f"{current}; pick another version with --to"
        )
    registry.move_alias(CHAMPION, target, expect=current, reason=f"rollback: {reason}", actor=actor)
    registry.set_status(target, VersionStatus.CHAMPION)
    registry.set_status(current, VersionStatus.RETIRED, error=f"rolled back: {reason}")
    registry.emit(
        PolicyRolledBack(
            event_id=f"rollback_{current}_{_ms()}",
            from_version=current,
            to_version=target,
            reason=reason,
            actor=actor,
        )
    )
    return current, target


def previous_champion(registry: PolicyRegistry, champion: str) -> str:
    """The version `champion` replaced (from the alias history), else its parent."""
    for event in reversed(registry.history(count=1000)):
        moved_to_it = isinstance(event, PolicyAliasMoved) and event.alias == CHAMPION
        if moved_to_it and event.version == champion and event.previous not in (None, champion):
            return event.previous
    parent = registry.get(champion).parent
    if parent:
        return parent
    raise ReleaseError(f"{champion} has no earlier champion to roll back to; name one with --to")


def apply_verdict(registry: PolicyRegistry, report: GateReport, *, canary: bool, actor: str) -> str:
    """Act on the gate: reject, keep for a retry (error), open the canary or promote; a message."""
    v = report.version
    if report.verdict == ERROR:
        record_report(registry, report)
        return f"{v}: the gate could not judge ({report.reason}); it stays READY and is retried"
    if report.verdict != PASS:
        reject(registry, report)
        return f"{v} rejected: {report.reason}"
    try:
        if canary:
            record_report(registry, report, canary={"started_at": time.time()})
            open_candidate(registry, v, actor=actor)
            return f"{v} passed the gate and is the candidate: canary on"
        record_report(registry, report)
        promote(registry, v, actor=actor, reason="passed the eval gate")
        return f"{v} passed the gate and is the champion"
    except AliasConflict as exc:
        return f"{v} passed the gate but stays READY: {exc}"


def _clear_candidate(registry: PolicyRegistry, version: str, *, reason: str, actor: str) -> None:
    registry.move_alias(CANDIDATE, None, expect=version, reason=reason, actor=actor)


def _ms() -> int:
    return int(time.time() * 1000)
