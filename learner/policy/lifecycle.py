"""Policy versions and their lifecycle: the record, the statuses and their transition table,
and the one Redis script every registry write runs (`WRITE_SCRIPT`).

A write is checked whole before anything is written: the compare-and-set of the aliases it
moves, the status changes those moves imply (against `TRANSITIONS`), and that every alias
still names a version of its status; then the record, aliases, statuses, events and pub/sub
notices are written together. `learner.policy.registry.PolicyRegistry` composes the writes.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from typing import Any, NamedTuple

from agents.events import (
    PolicyAliasMoved,
    PolicyPublished,
    encode,
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


class Fenced(ReleaseError):
    """This writer's lease is gone (another learner holds it): it may write nothing."""


@dataclass(frozen=True)
class Fence:
    """A learner's lease as registry writes check it: `key` must still hold `value`."""

    key: str
    value: str


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
    checkpoint_digest: str | None = None  # `learner.policy.storage.folder_digest` at publish

    def to_hash(self) -> dict[str, str]:
        d = asdict(self)
        return {k: json.dumps(v) for k, v in d.items()}

    @classmethod
    def from_hash(cls, h: dict[bytes, bytes]) -> PolicyVersion:
        d = {k.decode(): json.loads(v) for k, v in h.items()}
        d["status"] = VersionStatus(d["status"])
        return cls(**d)


class Move(NamedTuple):
    """`alias` -> `to` (None clears it) if it names `expect` now (None: nothing); to == expect checks only."""

    alias: str
    to: str | None
    expect: str | None


class StatusChange(NamedTuple):
    """`version` -> `to`, with `error`; with `only_if`, only when the version is in that status now."""

    version: str
    to: VersionStatus
    error: str | None = None
    only_if: VersionStatus | None = None


# One write of the registry: checks first (a refused write writes nothing), then the writes.
# KEYS: 1 aliases hash, 2 events stream, 3 versions sorted set, 4.. the versions' hashes, then
# the fence's key when the writer holds a lease. ARGV: 1 the write as JSON
# (PolicyRegistry._apply), 2 the rules as JSON (TRANSITIONS, ALIAS_STATUS), 3 the channel.
# Returns {'ok'} or the refusal: {'fenced'|'exists'|'conflict'|'unknown'|'illegal'|'disagree'|
# 'unnamed', ...}.
WRITE_SCRIPT = """
local w = cjson.decode(ARGV[1])
local rules = cjson.decode(ARGV[2])
if w.fence then
  local holder = redis.call('GET', KEYS[w.fence.key])
  if holder ~= w.fence.value then return {'fenced', holder or ''} end
end
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

RULES = json.dumps(
    {
        "allowed": {s.value: {t.value: True for t in ts} for s, ts in TRANSITIONS.items()},
        "alias_status": {a: s.value for a, s in ALIAS_STATUS.items()},
    }
)


def write_spec(
    keys: dict[str, int],
    create: PolicyVersion | None,
    aliases: Sequence[Move],
    statuses: Sequence[StatusChange],
    events: Sequence[Any],
) -> dict[str, Any]:
    """The write as `WRITE_SCRIPT` reads it: strings only ("" for none), statuses and errors as stored."""
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
        "notices": notices(create, aliases, statuses, events),
    }
    if create is not None:
        write["create"] = {
            "version": create.version,
            "status": create.status.value,
            "fields": [x for kv in create.to_hash().items() for x in kv],
            "score": repr(create.created_at),
        }
    return write


def check_reply(outcome: str, *detail: str) -> bool:
    """The script's reply as the caller sees it: True, False (already created) or an error."""
    if outcome == "ok":
        return True
    if outcome == "exists":
        return False
    if outcome == "fenced":
        holder = detail[0].split("|", 1)[-1] if detail and detail[0] else "nobody"
        raise Fenced(
            f"this learner's lease is gone (now held by {holder}): it writes nothing to the "
            "registry; the round's events stay trainable for the learner that holds it"
        )
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


def notices(
    create: PolicyVersion | None,
    aliases: Sequence[Move],
    statuses: Sequence[StatusChange],
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
