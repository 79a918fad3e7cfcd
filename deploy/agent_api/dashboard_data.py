"""What the dashboard shows, gathered from Redis: the registry, the learner's status, the policy
servers' heartbeats, the streams, and live traffic (`traffic.Tally`).

The agent API imports no learner code: it reads the registry's hashes (`policy_version_key`,
each field JSON as `learner.policy.lifecycle.PolicyVersion.to_hash` writes it), the learner's
`arloop:learner:status` and the servers' `arloop:serving:*` keys, all named in agents/events/keys.py.
Blocking (sync Redis): the route runs it in a thread.
"""

from __future__ import annotations

import json
import time
from typing import Any

import redis

from agents.events import (
    LEARNER_LEASE,
    LEARNER_STATUS,
    ONE_SHARD,
    POLICY_ALIASES,
    POLICY_VERSIONS,
    SERVING_PREFIX,
    StreamShards,
    as_text,
    policy_version_key,
)
from deploy.agent_api import svg
from deploy.agent_api.traffic import Tally
from deploy.credentials import DEFAULT_TENANT
from deploy.stream_stats import all_stats

ROUND_METRICS = ("reward", "kl", "entropy", "clip_ratio", "completions/mean_length", "loss")
"""The per-round charts, by TRL's metric names (a version is one learner round)."""
UPDATE_KINDS = {"policy gradient": "", "KTO": "kto/", "DPO": "dpo/"}
"""A round's updates by kind -> the prefix of their metrics (`learner.round_metrics`): a round
of thumbs only trains by KTO, so its figures are `kto/kl`, `kto/loss`, not `kl`, `loss`."""
LAGGING_AFTER_S = 60.0
"""A running learner reads the streams continuously: an entry left unread longer than this
means it is busy in a long round or stuck (docs/pages.md)."""


def snapshot(
    client: redis.Redis,
    tally: Tally,
    canary_share: float,
    tenant: str = DEFAULT_TENANT,
    shards: StreamShards = ONE_SHARD,
) -> dict[str, Any]:
    """Everything the dashboard page shows, JSON-ready, with its charts as SVG: live traffic
    is `tenant`'s; the registry, canary, streams (every shard's), learner and servers are the
    deployment's."""
    tally.refresh(client)
    aliases = {as_text(k): as_text(v) for k, v in client.hgetall(POLICY_ALIASES).items()}
    versions = read_versions(client)
    traffic = tally.traffic(tenant)
    held_out = held_out_success(versions)
    servers = serving(client)
    rows = [_row(v, aliases, held_out, traffic, servers) for v in versions]
    learner = _json(client.get(LEARNER_STATUS))
    stats = all_stats(client, shards)
    data = {
        "at": time.time(),
        "aliases": aliases,
        "versions": rows,
        "rounds": rounds(versions),
        "canary": canary(aliases, learner, canary_share),
        "streams": stats,
        "learner": learner,
        "learner_state": learner_state(learner, _lease(client), stats),
        "servers": servers,
        "delivery": delivery(aliases, servers),
    }
    data["charts"] = charts(data)
    return data


def canary(
    aliases: dict[str, str], learner: dict[str, Any] | None, share: float
) -> dict[str, Any] | None:
    """The canary out now, its arms named by the registry's aliases; the learner's figures
    only when its last check was of these two versions (else `checked` is False)."""
    if "candidate" not in aliases:
        return None
    arms = {"candidate": aliases["candidate"], "champion": aliases.get("champion")}
    check = (learner or {}).get("canary") or {}
    same = all(check.get(arm) == version for arm, version in arms.items())
    return {**(check if same else {}), "share": share, **arms, "checked": same}


def learner_state(
    status: dict[str, Any] | None, lease: str | None | PermissionError, stats: dict[str, Any]
) -> dict[str, Any]:
    """running / lagging / stopped / never, with the line that says why (docs/pages.md).

    The lease (renewed from a thread, even during a long round) says whether a learner process
    is alive; the streams' oldest unread entry (read now, not the learner's last report) says
    whether it keeps up."""
    if isinstance(lease, PermissionError):
        return {
            "state": "unknown",
            "line": f"Learner state unknown: this agent API's Redis user may not read "
            f"{LEARNER_LEASE}; grant it %R~{LEARNER_LEASE} (deploy/manifests/redis-acl.conf).",
        }
    updated = (status or {}).get("updated_at")
    seen = f"last report {time.time() - updated:.0f} s ago" if updated else "no report yet"
    if lease is None:
        if status is None:
            return {"state": "never", "line": "No learner has run on this Redis."}
        return {
            "state": "stopped",
            "line": f"Learner stopped: it holds no lease; {seen}. "
            "Feedback waits in the streams until `arloop learn` runs again.",
        }
    holder = lease.partition("|")[2]
    oldest = max((s.get("lag_seconds") or 0.0 for s in stats["streams"]), default=0.0)
    if oldest > LAGGING_AFTER_S:
        return {
            "state": "lagging",
            "holder": holder,
            "line": f"Learner lagging: {holder} holds the lease but the oldest unread entry is "
            f"{oldest:.0f} s old (over {LAGGING_AFTER_S:.0f} s: in a long round, or stuck); "
            f"{seen}.",
        }
    return {
        "state": "running",
        "holder": holder,
        "line": f"Learner running: {holder} holds the lease and reads the streams; {seen}.",
    }


def read_versions(client: redis.Redis) -> list[dict[str, Any]]:
    """Every version's record, oldest first (fields decoded from the registry's JSON)."""
    names = [as_text(v) for v in client.zrange(POLICY_VERSIONS, 0, -1)]
    out = []
    for name in names:
        fields = client.hgetall(policy_version_key(name))
        if fields:
            out.append({as_text(k): json.loads(v) for k, v in fields.items()})
    return out


def held_out_success(versions: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """version -> held-out success from the gate reports (whole runs through the agent at the
    serving temperature: what users get): a version's own report gives its figure as
    candidate; a champion it was compared with gets the report's champion figure (the newest
    report wins)."""
    out: dict[str, dict[str, Any]] = {}
    for v in versions:  # oldest first: newer reports overwrite
        report = v.get("report") or {}
        c = (report.get("episodes") or {}).get("comparison")
        if not c:
            continue
        for side, version in (("champion", report.get("champion")), ("candidate", v["version"])):
            low, high = c.get(f"{side}_ci") or (None, None)
            out[version] = {
                "rate": c[f"{side}_rate"],
                "solved": c.get(f"{side}_solved"),
                "n": c["n"],
                "low": low,
                "high": high,
                "suite": report.get("suite", ""),
            }
    return out


def rounds(versions: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One entry per learner round (each published version), with its metrics: `name` for
    the policy-gradient updates', `kto/name` and `dpo/name` for the others'."""
    wanted = [prefix + k for k in ROUND_METRICS for prefix in UPDATE_KINDS.values()]
    return [
        {"version": v["version"], "parent": v.get("parent"), "created_at": v.get("created_at")}
        | {k: v["metrics"][k] for k in wanted if k in v["metrics"]}
        for v in versions
        if v.get("metrics")
    ]


def serving(client: redis.Redis) -> list[dict[str, Any]]:
    """The live policy servers' heartbeats (expired ones are gone)."""
    keys = sorted(as_text(k) for k in client.scan_iter(match=f"{SERVING_PREFIX}:*", count=100))
    found = [_json(client.get(k)) for k in keys]
    return [s for s in found if s is not None]


def delivery(aliases: dict[str, str], servers: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per alias: the version the registry names and what each live server serves for it."""
    out = []
    for alias, version in sorted(aliases.items()):
        serving = [s for s in servers if s.get("serving", {}).get(alias) == version]
        digests = sorted({s.get("digests", {}).get(version, "?") for s in serving})
        out.append(
            {
                "alias": alias,
                "version": version,
                "servers": len(serving),
                "of": len(servers),
                "digests": digests,
                "delivered": bool(serving) and len(serving) == len(servers),
                "consistent": len(digests) <= 1,
            }
        )
    return out


def _row(v, aliases, held_out, traffic, servers) -> dict[str, Any]:
    report = v.get("report") or {}
    name = v["version"]
    return {
        "version": name,
        "parent": v.get("parent"),
        "status": v.get("status"),
        "aliases": sorted(a for a, target in aliases.items() if target == name),
        "created_at": v.get("created_at"),
        "checkpoint_kind": v.get("checkpoint_kind"),
        "held_out": held_out.get(name),
        "traffic": traffic.get(name),
        "gate": {
            "verdict": report.get("verdict", "base" if v.get("parent") is None else None),
            "failed": report.get("failed", []),
            "reason": report.get("reason"),
            "summary": report.get("summary"),
        },
        "served_by": sum(1 for s in servers if name in s.get("serving", {}).values()),
        "error": v.get("error"),
    }


def charts(data: dict[str, Any]) -> dict[str, str]:
    versions = data["versions"]
    held = [
        svg.Point(r["version"], r["held_out"]["rate"], r["held_out"]["low"], r["held_out"]["high"])
        for r in versions
        if r["held_out"]
    ]
    live = [(r["version"], r["traffic"]) for r in versions if r["traffic"]]
    pct = lambda v: f"{v:.0%}"  # noqa: E731
    out = {
        "held_out": svg.chart(
            "held-out success (95% interval)",
            [svg.Series("held-out", held)],
            y_range=(0.0, 1.0),
            fmt=pct,
        ),
        "live": svg.chart(
            "live traffic",
            [
                svg.Series("thumbs-up rate", _points(live, "thumbs_up_rate")),
                svg.Series("feedback rate", _points(live, "feedback_rate")),
            ],
            y_range=(0.0, 1.0),
            fmt=pct,
        ),
    }
    for name in ROUND_METRICS:
        series = [
            svg.Series(
                kind,
                [svg.Point(r["version"], r[p + name]) for r in data["rounds"] if p + name in r],
            )
            for kind, p in UPDATE_KINDS.items()
        ]
        out[name] = svg.chart(f"round {name}", [s for s in series if s.points] or series[:1])
    return out


def _points(items: list[tuple[str, dict[str, Any]]], key: str) -> list[svg.Point]:
    return [svg.Point(v, t[key]) for v, t in items if t.get(key) is not None]


def _lease(client: redis.Redis) -> str | None | PermissionError:
    """The learner's lease (`<token>|<holder>`), None when no learner holds it, or the refusal
    of a Redis user whose ACL predates the dashboard's reading it."""
    try:
        raw = client.get(LEARNER_LEASE)
    except redis.exceptions.NoPermissionError as exc:
        return PermissionError(str(exc))
    return None if raw is None else as_text(raw)


def _json(raw: bytes | str | None) -> Any:
    if raw is None:
        return None
    try:
        return json.loads(raw)
    except ValueError:
        return None
