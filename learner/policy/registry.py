"""The policy registry in Redis: versions, their checkpoints, and the aliases that serving follows.

Layout (all under `arloop:policy:`):
  seq                 counter behind version names v1, v2, ...
  v:{version}         hash: one version's record (see PolicyVersion)
  versions            sorted set: version -> creation time
  aliases             hash: alias (champion, candidate) -> version
  events              stream: PolicyPublished / PolicyAliasMoved / PolicyRolledBack / ...
  changed             pub/sub channel: a version or alias moved (payload: what moved)
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from typing import Any

import redis

from agents.events import (
    POLICY_ALIASES,
    POLICY_CHANNEL,
    POLICY_PREFIX,
    STREAM_POLICY,
    PolicyAliasMoved,
    PolicyPublished,
    decode,
    encode,
    new_id,
)

CHAMPION = "champion"
CANDIDATE = "candidate"
BASE_VERSION = "v0"


class VersionStatus(StrEnum):
    READY = "ready"  # published, not (yet) evaluated or serving
    CANDIDATE = "candidate"
    CHAMPION = "champion"
    REJECTED = "rejected"  # the eval gate refused it
    RETIRED = "retired"  # served once, replaced or rolled back
    BROKEN = "broken"  # its checkpoint failed to load


class AliasConflict(RuntimeError):
    """The alias moved under us (another learner or operator won the race)."""


class UnknownVersion(KeyError):
    """No such version or alias in the registry."""


@dataclass
class PolicyVersion:
    version: str
    parent: str | None
    base_model: str
    checkpoint_uri: str
    checkpoint_kind: str  # base | lora | full
    status: VersionStatus = VersionStatus.READY
    created_at: float = field(default_factory=time.time)
    metrics: dict[str, float] = field(default_factory=dict)
    report: dict[str, Any] | None = None
    error: str | None = None

    def to_hash(self) -> dict[str, str]:
        d = asdict(self)
        return {k: json.dumps(v) for k, v in d.items()}

    @classmethod
    def from_hash(cls, h: dict[bytes, bytes]) -> PolicyVersion:
        d = {k.decode(): json.loads(v) for k, v in h.items()}
        d["status"] = VersionStatus(d["status"])
        return cls(**d)


# Compare-and-set of one alias, with its event and notification, in one atomic step.
# KEYS: aliases hash, events stream. ARGV: alias, new version ("" clears), expected ("" none,
# "*" any), event fields as JSON, channel.
_MOVE_ALIAS = """
local current = redis.call('HGET', KEYS[1], ARGV[1])
if ARGV[3] ~= '*' then
  local expected = ARGV[3]
  if expected == '' then expected = false end
  if current ~= expected then return {0, current or ''} end
end
if ARGV[2] == '' then redis.call('HDEL', KEYS[1], ARGV[1])
else redis.call('HSET', KEYS[1], ARGV[1], ARGV[2]) end
local f = cjson.decode(ARGV[4])
redis.call('XADD', KEYS[2], '*', 'type', f.type, 'schema_version', f.schema_version,
           'event_id', f.event_id, 'data', f.data)
redis.call('PUBLISH', ARGV[5], 'alias:' .. ARGV[1])
return {1, current or ''}
"""

ANY = "*"


class PolicyRegistry:
    """Reads and atomic writes of the registry; every move is also an event in Redis."""

    def __init__(self, client: redis.Redis) -> None:
        self.r = client
        self._move = client.register_script(_MOVE_ALIAS)

    def _key(self, version: str) -> str:
        return f"{POLICY_PREFIX}:v:{version}"

    def next_version(self) -> str:
        return f"v{self.r.incr(f'{POLICY_PREFIX}:seq')}"

    def ensure_base(self, base_model: str) -> PolicyVersion:
        """Register the untrained base as v0 and make it champion, once per registry."""
        record = PolicyVersion(
            version=BASE_VERSION,
            parent=None,
            base_model=base_model,
            checkpoint_uri=f"base:{base_model}",
            checkpoint_kind="base",
            status=VersionStatus.CHAMPION,
        )
        if self.r.hsetnx(self._key(BASE_VERSION), "version", json.dumps(BASE_VERSION)):
            self._write(record)
            self.r.xadd(STREAM_POLICY, encode(_published(record)))
            self.move_alias(CHAMPION, BASE_VERSION, expect="", reason="base model", actor="system")
        return self.get(BASE_VERSION)

    def publish(self, record: PolicyVersion, *, trained_events: int = 0) -> None:
        """Add a version (status READY unless set); serving picks it up when an alias moves."""
        self._write(record)
        self.r.xadd(STREAM_POLICY, encode(_published(record, trained_events)))
        self.r.publish(POLICY_CHANNEL, f"version:{record.version}")

    def _write(self, record: PolicyVersion) -> None:
        pipe = self.r.pipeline(transaction=True)
        pipe.hset(self._key(record.version), mapping=record.to_hash())
        pipe.zadd(f"{POLICY_PREFIX}:versions", {record.version: record.created_at})
        pipe.execute()

    def get(self, version: str) -> PolicyVersion:
        h = self.r.hgetall(self._key(version))
        if not h or b"status" not in h:
            raise UnknownVersion(version)
        return PolicyVersion.from_hash(h)

    def exists(self, version: str) -> bool:
        return bool(self.r.exists(self._key(version)))

    def versions(self) -> list[PolicyVersion]:
        names = [v.decode() for v in self.r.zrange(f"{POLICY_PREFIX}:versions", 0, -1)]
        return [self.get(v) for v in names]

    def aliases(self) -> dict[str, str]:
        return {k.decode(): v.decode() for k, v in self.r.hgetall(POLICY_ALIASES).items()}

    def resolve(self, name: str) -> str:
        """A version name for an alias or a version; UnknownVersion when neither exists."""
        target = self.r.hget(POLICY_ALIASES, name)
        version = target.decode() if target else name
        if not self.exists(version):
            raise UnknownVersion(name)
        return version

    def set_status(self, version: str, status: VersionStatus, error: str | None = None) -> None:
        self.r.hset(
            self._key(version), mapping={"status": json.dumps(status), "error": json.dumps(error)}
        )
        self.r.publish(POLICY_CHANNEL, f"version:{version}")

    def attach_report(self, version: str, report: dict[str, Any]) -> None:
        self.r.hset(self._key(version), "report", json.dumps(report))

    def move_alias(
        self, alias: str, version: str | None, *, expect: str | None = ANY, reason: str, actor: str
    ) -> str | None:
        """Point `alias` at `version` (None clears it) if it still points at `expect`.

        `expect=""` means "only if unset", `ANY` skips the check. Returns the previous target;
        raises AliasConflict when another writer moved the alias first.
        """
        if version is not None and not self.exists(version):
            raise UnknownVersion(version)
        previous = self.r.hget(POLICY_ALIASES, alias)
        event = PolicyAliasMoved(
            event_id=new_id("alias"),
            alias=alias,
            version=version,
            previous=previous.decode() if previous else None,
            reason=reason,
            actor=actor,
        )
        ok, current = self._move(
            keys=[POLICY_ALIASES, STREAM_POLICY],
            args=[
                alias,
                version or "",
                "" if expect is None else expect,
                json.dumps(encode(event)),
                POLICY_CHANNEL,
            ],
        )
        current = current.decode() if isinstance(current, bytes) else current
        if not ok:
            raise AliasConflict(
                f"{alias} points at {current or 'nothing'}, not {expect or 'nothing'}: "
                "another writer moved it first"
            )
        return current or None

    def emit(self, event: Any) -> None:
        """Record a policy event (PolicyRejected, PolicyRolledBack, ...) on the events stream."""
        self.r.xadd(STREAM_POLICY, encode(event))
        self.r.publish(POLICY_CHANNEL, f"event:{type(event).__name__}")

    def history(self, count: int = 100) -> list[Any]:
        """The newest policy events, oldest first."""
        entries = self.r.xrevrange(STREAM_POLICY, count=count)
        return [decode(fields) for _, fields in reversed(entries)]


def _published(record: PolicyVersion, trained_events: int = 0) -> PolicyPublished:
    return PolicyPublished(
        event_id=f"published_{record.version}_{int(record.created_at * 1000)}",
        version=record.version,
        parent=record.parent,
        base_model=record.base_model,
        checkpoint_uri=record.checkpoint_uri,
        checkpoint_kind=record.checkpoint_kind,  # type: ignore[arg-type]
        metrics=record.metrics,
        trained_events=trained_events,
        eval_report=record.report,
    )
