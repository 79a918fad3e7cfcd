"""`arloop policy list|promote|rollback` and `arloop eval`: release control for people.

Every move goes through `learner.gate.release`, so it is one registry write (the alias
compare-and-set, the statuses it implies, an event on `arloop:policy:events`) and what people
do shows in `policy list` next to what the learner did.
Exit codes: 0 done (eval: pass), 1 refused (eval: reject), 2 cannot run (eval: error).
"""

from __future__ import annotations

import getpass
import json
from datetime import datetime
from typing import Any

import redis
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from agents.events import (
    PolicyAliasMoved,
    PolicyPublished,
    PolicyRejected,
    PolicyRolledBack,
    RegistryRewound,
)
from deploy import redis_conn
from deploy.embedded_redis import RedisUnavailable, ensure_redis
from deploy.learn.settings import LearnerSettings
from deploy.settings_errors import explain
from learner.gate.release import ReleaseError, end_canary, promote, rollback
from learner.policy.legacy_keys import migrate_legacy_keys
from learner.policy.registry import (
    CANDIDATE,
    CHAMPION,
    AliasConflict,
    PolicyRegistry,
    PolicyVersion,
    UnknownVersion,
)

OK, REFUSED, CANNOT = 0, 1, 2


def actor() -> str:
    try:
        return f"cli:{getpass.getuser()}"
    except (KeyError, OSError):  # no login name in some containers
        return "cli"


def open_registry(settings: LearnerSettings) -> tuple[PolicyRegistry, str]:
    url = ensure_redis(settings.redis_url, settings.data_dir)
    redis_conn.check_mode(settings.redis_url, settings)
    client = settings.redis_client(url)
    migrate_legacy_keys(client)
    return PolicyRegistry(client), url


def versions_table(registry: PolicyRegistry) -> Table:
    """One row per version: status, aliases, gate verdict and why, a few training figures."""
    aliases: dict[str, list[str]] = {}
    for alias, version in registry.aliases().items():
        aliases.setdefault(version, []).append(alias)
    table = Table(title="policy versions")
    for col in ("version", "parent", "status", "aliases", "created", "gate", "why", "reward", "kl"):
        table.add_column(col)
    for v in registry.versions():
        table.add_row(
            v.version,
            v.parent or "-",
            v.status.value,
            ", ".join(sorted(aliases.get(v.version, []))) or "-",
            _when(v.created_at),
            *_gate(v),
            _num(v.metrics.get("reward")),
            _num(v.metrics.get("kl")),
        )
    return table


def events_table(registry: PolicyRegistry, count: int) -> Table:
    """The newest registry events, oldest first: who moved what, and why."""
    table = Table(title=f"last {count} policy events")
    for col in ("when", "event", "what", "who", "why"):
        table.add_column(col)
    for e in registry.history(count=count):
        table.add_row(_when(e.created_at), type(e).__name__, *_describe(e))
    return table


def list_versions(settings: LearnerSettings, console: Console, events: int = 10) -> int:
    registry, _ = open_registry(settings)
    console.print(versions_table(registry))
    console.print(events_table(registry, events))
    return OK


def promote_version(settings: LearnerSettings, console: Console, version: str, force: bool) -> int:
    registry, _ = open_registry(settings)
    try:
        previous = promote(registry, version, actor=actor(), reason="operator", force=force)
    except (ReleaseError, AliasConflict, UnknownVersion) as exc:
        return _refused(console, exc)
    console.print(f"{registry.resolve(CHAMPION)} is the champion (was {previous or 'none'})")
    return OK


def rollback_version(
    settings: LearnerSettings, console: Console, to: str | None, candidate: bool
) -> int:
    registry, _ = open_registry(settings)
    try:
        if candidate:
            current = registry.aliases().get(CANDIDATE)
            if current is None:
                raise ReleaseError("no candidate is out: nothing to roll back")
            end_canary(registry, current, actor=actor(), reason="operator")
            console.print(
                f"candidate {current} rolled back; champion stays {registry.resolve(CHAMPION)}"
            )
            return OK
        old, new = rollback(registry, to=to, actor=actor(), reason="operator")
    except (ReleaseError, AliasConflict, UnknownVersion) as exc:
        return _refused(console, exc)
    console.print(f"champion rolled back from {old} to {new}")
    return OK


def run_eval(
    settings: LearnerSettings,
    console: Console,
    version: str | None,
    against: str,
    apply: bool,
    as_json: bool,
) -> int:
    """Gate `version` (default: the newest) against `against`; print the report."""
    from deploy.learn.agent_runs import gate_runner
    from learner.gate.control import GateLines
    from learner.gate.eval_gate import ERROR, PASS
    from learner.gate.release import apply_verdict
    from learner.gate.runner import SuiteMissing
    from learner.store import Store

    registry, url = open_registry(settings)
    store_path = settings.data_dir / "learner" / "store.db"
    store = Store(store_path) if store_path.exists() else None
    try:
        lines = GateLines((Console(stderr=True) if as_json else console).print)  # JSON stays clean
        gate = gate_runner(
            settings, url, registry, store, progress=lines.progress, looked=lines.looked
        )
        target = version or registry.versions()[-1].version
        report = gate.evaluate(target, against)
    except (SuiteMissing, UnknownVersion) as exc:
        return _cannot(console, exc)
    finally:
        if store is not None:
            store.close()
    console.print(json.dumps(report.to_dict(), indent=2) if as_json else report.summary())
    if apply:
        console.print(
            apply_verdict(registry, report, canary=settings.canary.enabled, actor=actor())
        )
    return {PASS: OK, ERROR: CANNOT}.get(report.verdict, REFUSED)


def _gate(v: PolicyVersion) -> tuple[str, str]:
    report: dict[str, Any] = v.report or {}
    verdict = report.get("verdict", "-")
    why = ", ".join(report.get("failed", [])) or (v.error or "")
    return verdict, why or "-"


def _describe(e: Any) -> tuple[str, str, str]:
    if isinstance(e, PolicyAliasMoved):
        return f"{e.alias}: {e.previous or '-'} -> {e.version or '-'}", e.actor, e.reason
    if isinstance(e, PolicyRolledBack):
        return f"{e.from_version} -> {e.to_version}", e.actor, e.reason
    if isinstance(e, PolicyRejected):
        return f"{e.version} rejected ({', '.join(e.failed)})", "gate", e.reason
    if isinstance(e, PolicyPublished):
        return f"{e.version} (parent {e.parent or '-'})", "-", f"{e.trained_events} events"
    if isinstance(e, RegistryRewound):
        lost = ", ".join(e.lost_versions)
        return f"REWOUND: lost {lost}, serving {e.champion or '-'}", e.actor, e.reason
    return "-", "-", "-"


def _when(t: float) -> str:
    return datetime.fromtimestamp(t).strftime("%Y-%m-%d %H:%M:%S") if t else "-"


def _num(x: float | None) -> str:
    return "-" if x is None else f"{x:+.3f}"


def _refused(console: Console, exc: Exception) -> int:
    message = f"no such version or alias: {exc}" if isinstance(exc, UnknownVersion) else str(exc)
    console.print(f"[red]refused:[/] {message}")
    return REFUSED


def _cannot(console: Console, exc: Exception) -> int:
    console.print(f"[red]arloop eval:[/] {exc}")
    return CANNOT


def main(command: str, **kwargs: Any) -> int:
    """Settings, console and error messages around one command; returns the exit code."""
    from pydantic import ValidationError
    from pydantic_settings import SettingsError

    console = Console(soft_wrap=True)
    try:
        settings = LearnerSettings()
        handlers = {
            "list": list_versions,
            "promote": promote_version,
            "rollback": rollback_version,
            "eval": run_eval,
        }
        return handlers[command](settings, console, **kwargs)
    except (ValidationError, SettingsError) as exc:
        for line in explain(exc, LearnerSettings):
            console.print(f"[red]invalid setting:[/] {escape(line)}")

    except (RedisUnavailable, redis.ConnectionError) as exc:
        console.print(f"[red]cannot reach Redis:[/] {exc} (set ARLOOP_REDIS_URL)")
    return CANNOT
