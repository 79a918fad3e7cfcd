"""Release moves: a gated version becomes the candidate, then champion, or is rejected or rolled back.

Each move is one registry write (`PolicyRegistry.promote`, `open_candidate`,
`withdraw_candidate`, `reject`): the compare-and-set of an alias, the status changes it implies
(the table beside `VersionStatus`) and its events on `arloop:policy:events`, all at once. Two
learners or operators racing: one wins, the other gets `AliasConflict`; `arloop policy list`
shows who moved what and why. This module adds the release rules on top, and is the one path every promotion takes (the
gate's, an operator's, and with the gate off a round's): a rejected version needs `force`, a
version whose checkpoint is gone is never promoted. A rejected version never
moves `champion`.
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
    IllegalTransition,
    PolicyRegistry,
    PolicyVersion,
    ReleaseError,
    VersionStatus,
)


def checkpoint_problem(record: PolicyVersion) -> str | None:
    """Why a version's checkpoint cannot be served, or None when its files are in place
    (`learner.policy.models.checkpoint_problem`, the check the servers make before loading)."""
    from learner.policy.models import checkpoint_problem as problem  # torch: only when needed

    return problem(record)


def record_report(registry: PolicyRegistry, report: GateReport, **extra: Any) -> None:
    """Store the gate's report (JSON + summary) with the version."""
    registry.attach_report(report.version, report.to_dict() | extra)


def reject(registry: PolicyRegistry, report: GateReport) -> None:
    """The gate refused: report stored, then READY -> REJECTED with a PolicyRejected event naming why."""
    record_report(registry, report)
    rejected = PolicyRejected(
        event_id=f"rejected_{report.version}_{_ms()}",
        version=report.version,
        failed=report.failed,
        reason=report.reason,
    )
    registry.reject(report.version, error=report.reason, events=[rejected])


def open_candidate(registry: PolicyRegistry, version: str, *, actor: str) -> None:
    """`candidate` -> version, only if no candidate is out now (AliasConflict otherwise)."""
    registry.open_candidate(version, reason="passed the eval gate", actor=actor)


def promote(
    registry: PolicyRegistry,
    version: str,
    *,
    actor: str,
    reason: str,
    force: bool = False,
    parent: str | None = None,
) -> str | None:
    """`champion` -> version, compare-and-set against `parent` when given (a round's version
    replaces the one it trained from), else against the champion read now; returns the old one.
    Every promotion passes here: the gate's, an operator's, a round's with the gate off."""
    record = registry.get(registry.resolve(version))
    version = record.version
    if record.status is VersionStatus.REJECTED and not force:
        raise ReleaseError(
            f"{version} was rejected ({record.error}); promote it anyway with --force"
        )
    problem = checkpoint_problem(record)
    if problem:
        raise ReleaseError(f"cannot promote {version}: {problem}")
    current = parent or registry.aliases().get(CHAMPION)
    return registry.promote(version, expect=current, reason=reason, actor=actor)


def release_ungated(
    registry: PolicyRegistry, version: str, parent: str, *, actor: str
) -> str | None:
    """With the gate off, a round's published version is released at once: `promote` from its
    parent. None when it is the champion (again: a recovery after the move finds it made), else
    why it stays READY (another writer moved `champion`, or its checkpoint cannot be served)."""
    if registry.aliases().get(CHAMPION) == version:
        return None
    try:
        promote(registry, version, actor=actor, reason="learner round", parent=parent)
    except (AliasConflict, ReleaseError) as exc:
        return str(exc)
    return None


def end_canary(registry: PolicyRegistry, version: str, *, actor: str, reason: str) -> None:
    """Roll a candidate back: `candidate` cleared, the version REJECTED, a PolicyRolledBack event."""
    rolled_back = PolicyRolledBack(
        event_id=f"rollback_{version}_{_ms()}",
        from_version=version,
        to_version=registry.aliases().get(CHAMPION, ""),
        reason=reason,
        actor=actor,
    )
    registry.withdraw_candidate(
        version,
        error=f"rolled back: {reason}",
        reason=f"rolled back: {reason}",
        actor=actor,
        events=[rolled_back],
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
    rolled_back = PolicyRolledBack(
        event_id=f"rollback_{current}_{_ms()}",
        from_version=current,
        to_version=target,
        reason=reason,
        actor=actor,
    )
    registry.promote(
        target,
        expect=current,
        reason=f"rollback: {reason}",
        actor=actor,
        retired_error=f"rolled back: {reason}",
        events=[rolled_back],
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
    try:
        if report.verdict != PASS:
            reject(registry, report)
            return f"{v} rejected: {report.reason}"
        out = registry.aliases().get(CANDIDATE) if canary else None
        if out not in (None, v):  # one candidate at a time: gated again once that canary ends
            return (
                f"{v} passed the gate but stays READY: {out}'s canary is still running (one "
                f"candidate at a time). Next: `arloop learn` lets the canary decide, or `arloop "
                f"policy promote {out}` / `arloop policy rollback --candidate`; {v} is gated "
                "again after that"
            )
        if canary:
            record_report(registry, report, canary={"started_at": time.time()})
            open_candidate(registry, v, actor=actor)
            return f"{v} passed the gate and is the candidate: canary on"
        record_report(registry, report)
        promote(registry, v, actor=actor, reason="passed the eval gate")
        return f"{v} passed the gate and is the champion"
    except AliasConflict as exc:
        return f"{v} passed the gate but stays READY: {exc}"
    except IllegalTransition as exc:
        return f"{v}: the verdict ({report.verdict}) cannot be applied: {exc}"


def _ms() -> int:
    return int(time.time() * 1000)
