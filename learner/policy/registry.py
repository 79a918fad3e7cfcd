"""The policy registry in Redis: versions, their checkpoints, and the aliases that serving follows.

Layout (all under `arloop:policy:`):
  seq                 counter behind version names v1, v2, ...
  v:{version}         hash: one version's record (see PolicyVersion)
  versions            sorted set: version -> creation time
  aliases             hash: alias (champion, candidate) -> version
  events              stream: PolicyPublished / PolicyAliasMoved / PolicyRolledBack / ...
  changed             pub/sub channel: a version or alias moved (payload: what moved)

Every write is one Lua script (`_WRITE`): the compare-and-set of the aliases it moves, the
status changes those moves imply (checked against `TRANSITIONS`), its events and its notices,
all or nothing. A crash or a racing writer can never leave an alias naming a version whose
status says otherwise.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from typing import Any, NamedTuple

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


def version_name(number: int) -> str:
    """The name of version `number` (v3 for 3): the registry's names, `version_number` reads them."""
    return f"v{number}"


def version_number(version: str | None) -> int | None:
    """3 for "v3"; None for anything else (an alias, a model name, None)."""
    m = re.fullmatch(r"v(\d+)", version or "")
    return int(m.group(1)) if m else None


class VersionStatus(StrEnum):
    """Where a version is in its lifecycle; `TRANSITIONS` holds the moves, `PolicyRegistry` makes them.

    from       to         by PolicyRegistry.   when
    (new)      READY      publish              a round's checkpoint is committed
    (new)      CHAMPION   ensure_base          v0, with the champion alias, once per registry
    READY      CANDIDATE  open_candidate       the gate passed, canary on
    READY      REJECTED   reject               the gate refused
    READY      CHAMPION   promote              no gate; the gate passed, canary off; an operator
    CANDIDATE  CHAMPION   promote              the canary won; an operator
    RETIRED    CHAMPION   promote              a rollback; an operator promotes an older version
    REJECTED   CHAMPION   promote              an operator with --force; a rollback --to it
    CHAMPION   RETIRED    promote              the champion the promoted version replaces
    CANDIDATE  REJECTED   withdraw_candidate   the canary lost or timed out; rollback --candidate
    any        BROKEN     mark_broken          a policy server could not load its checkpoint

    BROKEN is final: a broken version that an alias leaves keeps its status and error. While
    an alias names a version, its status is that alias's (or BROKEN). Crash recovery
    (`learner.publish.recover`) replays publish and promote, which are idempotent there.
    """

    READY = "ready"  # published, not (yet) evaluated or serving
    CANDIDATE = "candidate"
    CHAMPION = "champion"
    REJECTED = "rejected"  # the eval gate refused it, or its canary lost
    RETIRED = "retired"  # served once, replaced or rolled back
    BROKEN = "broken"  # its checkpoint failed to load


_S = VersionStatus
TRANSITIONS: dict[VersionStatus, frozenset[VersionStatus]] = {
    _S.READY: frozenset({_S.CANDIDATE, _S.REJECTED, _S.CHAMPION, _S.BROKEN}),
    _S.CANDIDATE: frozenset({_S.CHAMPION, _S.REJECTED, _S.BROKEN}),
    _S.CHAMPION: frozenset({_S.RETIRED, _S.BROKEN}),
    _S.RETIRED: frozenset({_S.CHAMPION, _S.BROKEN}),
    _S.REJECTED: frozenset({_S.CHAMPION, _S.BROKEN}),
    _S.BROKEN: frozenset({_S.BROKEN}),  # a second server failing too: its error is updated
}
"""status -> the statuses it may move to (the table in `VersionStatus`'s docstring)."""

ALIAS_STATUS = {CHAMPION: _S.CHAMPION, CANDIDATE: _S.CANDIDATE}
"""The status of a version while that alias names it (else it is BROKEN)."""


class ReleaseError(RuntimeError):
    """A move that cannot be made; the message says why and what to do."""


class IllegalTransition(ReleaseError):
    """A status change `TRANSITIONS` refuses, or one that would set an alias against a status."""


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


class _Move(NamedTuple):
    """`alias` -> `to` (None clears it) if it names `expect` now (None: nothing); to == expect checks only."""

    alias: str
    to: str | None
    expect: str | None


class _Status(NamedTuple):
    """`version` -> `to`, with `error`; with `only_if`, only when the version is in that status now."""

    version: str
    to: VersionStatus
    error: str | None = None
    only_if: VersionStatus | None = None


# One write of the registry: checks first (a refused write writes nothing), then the writes.
# KEYS: 1 aliases hash, 2 events stream, 3 versions sorted set, 4.. the versions' hashes.
# ARGV: 1 the write as JSON (PolicyRegistry._apply), 2 the rules as JSON (TRANSITIONS,
# ALIAS_STATUS), 3 the channel. Returns {'ok'} or the refusal: {'exists'|'conflict'|'unknown'|
# 'illegal'|'disagree'|'unnamed', ...}.
_WRITE = """
local w = cjson.decode(ARGV[1])
local rules = cjson.decode(ARGV[2])
local status = {}  -- version -> its status after this write (false: no such version)
local function final(version)
  if status[version] == nil then
    local s = redis.call('HGET', KEYS[w.keys[version]], 'status')
    status[version] = s and cjson.decode(s) or false
  end
  return status[version]
end
if w.create then
  if redis.call('EXISTS', KEYS[w.keys[w.create.version]]) == 1 then return {'exists'} end
  status[w.create.version] = w.create.status
end
local named = {}  -- alias -> version after this write
local flat = redis.call('HGETALL', KEYS[1])
for i = 1, #flat, 2 do named[flat[i]] = flat[i + 1] end
for _, m in ipairs(w.aliases) do
  local current = named[m.alias] or ''
  if current ~= m.expect then return {'conflict', m.alias, current, m.expect} end
  if m.to == '' then named[m.alias] = nil else named[m.alias] = m.to end
end
local changed = {}
for i, c in ipairs(w.statuses) do
  local from = final(c.version)
  if not from then return {'unknown', c.version} end
  if c.only_if == '' or c.only_if == from then
    if not (rules.allowed[from] and rules.allowed[from][c.to]) then
      return {'illegal', c.version, from, c.to}
    end
    status[c.version] = c.to
    changed[i] = true
  end
end
local function agrees(alias, version)
  local s = final(version)
  return rules.alias_status[alias] == nil or s == rules.alias_status[alias] or s == 'broken'
end
for _, m in ipairs(w.aliases) do
  if m.to ~= '' and m.to ~= m.expect then
    if not final(m.to) then return {'unknown', m.to} end
    if not agrees(m.alias, m.to) then return {'disagree', m.alias, m.to, final(m.to)} end
  end
end
for i, c in ipairs(w.statuses) do
  if changed[i] then
    for alias, version in pairs(named) do
      if version == c.version and not agrees(alias, version) then
        return {'disagree', alias, version, status[version]}
      end
    end
    for alias, s in pairs(rules.alias_status) do
      if status[c.version] == s and named[alias] ~= c.version then
        return {'unnamed', c.version, s, alias, named[alias] or ''}
      end
    end
  end
end
if w.create then
  redis.call('HSET', KEYS[w.keys[w.create.version]], unpack(w.create.fields))
  redis.call('ZADD', KEYS[3], w.create.score, w.create.version)
end
for _, m in ipairs(w.aliases) do
  if m.to ~= m.expect then
    if m.to == '' then redis.call('HDEL', KEYS[1], m.alias)
    else redis.call('HSET', KEYS[1], m.alias, m.to) end
  end
end
for i, c in ipairs(w.statuses) do
  if changed[i] then
    redis.call('HSET', KEYS[w.keys[c.version]], 'status', c.status, 'error', c.error)
  end
end
for _, e in ipairs(w.events) do redis.call('XADD', KEYS[2], '*', unpack(e)) end
for _, n in ipairs(w.notices) do redis.call('PUBLISH', ARGV[3], n) end
return {'ok'}
"""

_RULES = json.dumps(
    {
        "allowed": {s.value: {t.value: True for t in ts} for s, ts in TRANSITIONS.items()},
        "alias_status": {a: s.value for a, s in ALIAS_STATUS.items()},
    }
)


class PolicyRegistry:
    """Reads of the registry, and its writes: each lifecycle move one atomic script."""

    def __init__(self, client: redis.Redis) -> None:
        self.r = client
        self._write = client.register_script(_WRITE)

    def _key(self, version: str) -> str:
        return f"{POLICY_PREFIX}:v:{version}"

    def next_version(self) -> str:
        return version_name(self.r.incr(f"{POLICY_PREFIX}:seq"))

    # -- reads -----------------------------------------------------------------------------

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

    def history(self, count: int = 100) -> list[Any]:
        """The newest policy events, oldest first."""
        entries = self.r.xrevrange(STREAM_POLICY, count=count)
        return [decode(fields) for _, fields in reversed(entries)]

    # -- the lifecycle (the table in VersionStatus) ----------------------------------------

    def ensure_base(self, base_model: str) -> PolicyVersion:
        """(new) -> CHAMPION: the untrained base as v0, with the champion alias, once per registry."""
        if not self.exists(BASE_VERSION):
            record = PolicyVersion(
                version=BASE_VERSION,
                parent=None,
                base_model=base_model,
                checkpoint_uri=f"base:{base_model}",
                checkpoint_kind="base",
                status=VersionStatus.CHAMPION,
            )
            move = _Move(CHAMPION, BASE_VERSION, None)
            events = [_published(record), _moved(move, "base model", "system")]
            self._apply(create=record, aliases=[move], events=events)  # False: another won
        return self.get(BASE_VERSION)

    def publish(self, record: PolicyVersion, *, trained_events: int = 0) -> None:
        """(new) -> READY: add a version; serving picks it up when an alias moves to it."""
        if record.status is not VersionStatus.READY:
            raise IllegalTransition(f"{record.version} is published ready, not {record.status}")
        if not self._apply(create=record, events=[_published(record, trained_events)]):
            raise ReleaseError(f"{record.version} is already in the registry")

    def promote(
        self,
        version: str,
        *,
        expect: str | None,
        reason: str,
        actor: str,
        retired_error: str | None = None,
        events: Sequence[Any] = (),
    ) -> str | None:
        """`champion` expect -> version, in one write with what it implies; returns `expect`.

        The version becomes CHAMPION, `expect` RETIRED (with `retired_error`; a broken one stays
        broken), and a `candidate` alias naming the version is cleared; `events` are recorded
        with the move. AliasConflict when `champion` is not `expect` or `candidate` moved.
        """
        if version == expect:
            raise ReleaseError(f"{version} is already the champion")
        candidate = self.aliases().get(CANDIDATE)
        champion = _Move(CHAMPION, version, expect)
        moves, moved = [champion], [_moved(champion, reason, actor)]
        if candidate == version:
            cleared = _Move(CANDIDATE, None, version)
            moves.append(cleared)
            moved.append(_moved(cleared, f"promoted: {reason}", actor))
        else:
            moves.append(_Move(CANDIDATE, candidate, candidate))  # it did not move meanwhile
        statuses = [_Status(version, VersionStatus.CHAMPION)]
        if expect is not None:
            retired = _Status(expect, VersionStatus.RETIRED, retired_error, VersionStatus.CHAMPION)
            statuses.append(retired)
        self._apply(aliases=moves, statuses=statuses, events=[*moved, *events])
        return expect

    def open_candidate(self, version: str, *, reason: str, actor: str) -> None:
        """`candidate` -> version, only if no candidate is out (AliasConflict); READY -> CANDIDATE."""
        move = _Move(CANDIDATE, version, None)
        self._apply(
            aliases=[move],
            statuses=[_Status(version, VersionStatus.CANDIDATE)],
            events=[_moved(move, reason, actor)],
        )

    def withdraw_candidate(
        self, version: str, *, error: str, reason: str, actor: str, events: Sequence[Any] = ()
    ) -> None:
        """`candidate` version -> nothing, CANDIDATE -> REJECTED with `error`, in one write."""
        move = _Move(CANDIDATE, None, version)
        self._apply(
            aliases=[move],
            statuses=[_Status(version, VersionStatus.REJECTED, error, VersionStatus.CANDIDATE)],
            events=[_moved(move, reason, actor), *events],
        )

    def reject(self, version: str, *, error: str, events: Sequence[Any] = ()) -> None:
        """READY -> REJECTED with `error` (the gate refused), with its events."""
        self._apply(statuses=[_Status(version, VersionStatus.REJECTED, error)], events=events)

    def mark_broken(self, version: str, error: str) -> None:
        """Any -> BROKEN: its checkpoint failed to load; aliases stay (serving keeps what it has)."""
        self._apply(statuses=[_Status(version, VersionStatus.BROKEN, error)])

    def attach_report(self, version: str, report: dict[str, Any]) -> None:
        self.r.hset(self._key(version), "report", json.dumps(report))

    def _apply(
        self,
        *,
        create: PolicyVersion | None = None,
        aliases: Sequence[_Move] = (),
        statuses: Sequence[_Status] = (),
        events: Sequence[Any] = (),
    ) -> bool:
        """Run one write atomically; False when `create` exists already, raises on a refusal."""
        names = [s.version for s in statuses] + [m.to for m in aliases if m.to]
        names += [create.version] if create else []
        keys = {v: i + 4 for i, v in enumerate(dict.fromkeys(names))}  # KEYS[4..] in Lua
        write = _write_spec(keys, create, aliases, statuses, events)
        reply = self._write(
            keys=[POLICY_ALIASES, STREAM_POLICY, f"{POLICY_PREFIX}:versions"]
            + [self._key(v) for v in keys],
            args=[json.dumps(write), _RULES, POLICY_CHANNEL],
        )
        return _check(*[x.decode() if isinstance(x, bytes) else x for x in reply])


def _write_spec(
    keys: dict[str, int],
    create: PolicyVersion | None,
    aliases: Sequence[_Move],
    statuses: Sequence[_Status],
    events: Sequence[Any],
) -> dict[str, Any]:
    """The write as `_WRITE` reads it: strings only ("" for none), statuses and errors as stored."""
    write: dict[str, Any] = {
        "keys": keys,
        "aliases": [
            {"alias": m.alias, "to": m.to or "", "expect": m.expect or ""} for m in aliases
        ],
        "statuses": [
            {
                "version": s.version,
                "to": s.to.value,
                "only_if": s.only_if.value if s.only_if else "",
                "status": json.dumps(s.to),
                "error": json.dumps(s.error),
            }
            for s in statuses
        ],
        "events": [[x for kv in encode(e).items() for x in kv] for e in events],
        "notices": _notices(create, aliases, statuses, events),
    }
    if create is not None:
        write["create"] = {
            "version": create.version,
            "status": create.status.value,
            "fields": [x for kv in create.to_hash().items() for x in kv],
            "score": repr(create.created_at),
        }
    return write


def _check(outcome: str, *detail: str) -> bool:
    """The script's reply as the caller sees it: True, False (already created) or an error."""
    if outcome == "ok":
        return True
    if outcome == "exists":
        return False
    if outcome == "conflict":
        alias, current, expect = detail
        raise AliasConflict(
            f"{alias} points at {current or 'nothing'}, not {expect or 'nothing'}: "
            "another writer moved it first"
        )
    if outcome == "unknown":
        raise UnknownVersion(detail[0])
    if outcome == "illegal":
        version, current, wanted = detail
        allowed = ", ".join(sorted(TRANSITIONS[VersionStatus(current)])) or "nothing"
        raise IllegalTransition(
            f"{version} cannot go from {current} to {wanted} "
            f"(a {current} version can become: {allowed})"
        )
    if outcome == "disagree":
        alias, version, status = detail
        raise IllegalTransition(
            f"{alias} would name {version} while it is {status}: "
            f"a version {alias} names is {ALIAS_STATUS[alias]} (or broken)"
        )
    version, status, alias, named = detail  # unnamed
    raise IllegalTransition(f"{version} would be {status} while {alias} names {named or 'nothing'}")


def _notices(
    create: PolicyVersion | None,
    aliases: Sequence[_Move],
    statuses: Sequence[_Status],
    events: Sequence[Any],
) -> list[str]:
    """The pub/sub payloads of a write: what moved."""
    versions = [s.version for s in statuses] + ([create.version] if create else [])
    return (
        [f"alias:{m.alias}" for m in aliases if m.to != m.expect]
        + [f"version:{v}" for v in dict.fromkeys(versions)]
        + [
            f"event:{type(e).__name__}"
            for e in events
            if not isinstance(e, PolicyAliasMoved | PolicyPublished)
        ]
    )


def _moved(move: _Move, reason: str, actor: str) -> PolicyAliasMoved:
    return PolicyAliasMoved(
        event_id=new_id("alias"),
        alias=move.alias,
        version=move.to,
        previous=move.expect,
        reason=reason,
        actor=actor,
    )


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
