"""The policy registry in Redis: versions, their checkpoints, and the aliases that serving follows.

Layout (all under `arloop:policy:{policy}:`, one Redis Cluster slot with the learner's lease):
  seq                 counter behind version names v1, v2, ...
  v:{version}         hash: one version's record (see PolicyVersion)
  versions            sorted set: version -> creation time
  aliases             hash: alias (champion, candidate) -> version
  events              stream: PolicyPublished / PolicyAliasMoved / PolicyRolledBack / ...
  changed             pub/sub channel: a version or alias moved (payload: what moved)

Every write is one Lua script (`learner.policy.lifecycle.WRITE_SCRIPT`): the compare-and-set
of the aliases it moves, the status changes those moves imply (checked against `TRANSITIONS`),
its events and its notices, all or nothing. A crash or a racing writer can never leave an
alias naming a version whose status says otherwise.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import redis

from agents.events import (
    POLICY_ALIASES,
    POLICY_CHANNEL,
    POLICY_PREFIX,
    POLICY_VERSIONS,
    STREAM_POLICY,
    PolicyAliasMoved,
    PolicyPublished,
    decode,
    new_id,
    policy_version_key,
)
from learner.policy.lifecycle import (
    ALIAS_STATUS,
    BASE_VERSION,
    CANDIDATE,
    CHAMPION,
    RULES,
    TRANSITIONS,
    WRITE_SCRIPT,
    AliasConflict,
    Fence,
    Fenced,
    IllegalTransition,
    Move,
    PolicyVersion,
    ReleaseError,
    StatusChange,
    UnknownVersion,
    VersionStatus,
    check_reply,
    version_name,
    version_number,
    write_spec,
)

__all__ = [  # the lifecycle's names, importable from here as before the split
    "ALIAS_STATUS",
    "BASE_VERSION",
    "CANDIDATE",
    "CHAMPION",
    "TRANSITIONS",
    "AliasConflict",
    "BaseModelMismatch",
    "Fence",
    "Fenced",
    "IllegalTransition",
    "PolicyRegistry",
    "PolicyVersion",
    "ReleaseError",
    "UnknownVersion",
    "VersionStatus",
    "version_name",
    "version_number",
]


class BaseModelMismatch(ValueError):
    """The registry's v0 was made from another base model than this process was given: every
    version descends from v0, so serving or training another base would mix models."""


class PolicyRegistry:
    """Reads of the registry, and its writes: each lifecycle move one atomic script."""

    def __init__(self, client: redis.Redis, fence: Fence | None = None) -> None:
        self.r = client
        self.fence = fence
        """A learner's lease: every write checks it, in the same script (None: unfenced,
        as an operator's CLI or a policy server writes)."""
        self._write = client.register_script(WRITE_SCRIPT)

    def check_fence(self) -> None:
        """Fenced when this registry's lease is gone (checked again by every write)."""
        if self.fence is not None:
            holder = self.r.get(self.fence.key)
            if (holder.decode() if holder else None) != self.fence.value:
                check_reply("fenced", holder.decode() if holder else "")

    def _key(self, version: str) -> str:
        return policy_version_key(version)

    def next_version(self) -> str:
        return version_name(self.r.incr(f"{POLICY_PREFIX}:seq"))

    def counter(self) -> int:
        """The number behind the last version name handed out (0: none yet)."""
        return int(self.r.get(f"{POLICY_PREFIX}:seq") or 0)

    def names(self) -> set[str]:
        """Every version in the registry, by name (no records read)."""
        return {v.decode() for v in self.r.zrange(POLICY_VERSIONS, 0, -1)}

    # -- reads -----------------------------------------------------------------------------

    def get(self, version: str) -> PolicyVersion:
        h = self.r.hgetall(self._key(version))
        if not h or b"status" not in h:
            raise UnknownVersion(version)
        return PolicyVersion.from_hash(h)

    def exists(self, version: str) -> bool:
        return bool(self.r.exists(self._key(version)))

    def versions(self) -> list[PolicyVersion]:
        names = [v.decode() for v in self.r.zrange(POLICY_VERSIONS, 0, -1)]
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
            move = Move(CHAMPION, BASE_VERSION, None)
            events = [_published(record), _moved(move, "base model", "system")]
            self._apply(create=record, aliases=[move], events=events)  # False: another won
        base = self.get(BASE_VERSION)
        if base.base_model != base_model:
            raise BaseModelMismatch(
                f"ARLOOP_BASE_MODEL is {base_model!r} but this registry (its v0) was created "
                f"with {base.base_model!r}: set ARLOOP_BASE_MODEL={base.base_model}, or start "
                "a new registry (another ARLOOP_REDIS_URL or database; for the embedded Redis, "
                "another ARLOOP_DATA_DIR)"
            )
        return base

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
        champion = Move(CHAMPION, version, expect)
        moves, moved = [champion], [_moved(champion, reason, actor)]
        if candidate == version:
            cleared = Move(CANDIDATE, None, version)
            moves.append(cleared)
            moved.append(_moved(cleared, f"promoted: {reason}", actor))
        else:
            moves.append(Move(CANDIDATE, candidate, candidate))  # it did not move meanwhile
        statuses = [StatusChange(version, VersionStatus.CHAMPION)]
        if expect is not None:
            retired = StatusChange(
                expect, VersionStatus.RETIRED, retired_error, VersionStatus.CHAMPION
            )
            statuses.append(retired)
        self._apply(aliases=moves, statuses=statuses, events=[*moved, *events])
        return expect

    def open_candidate(self, version: str, *, reason: str, actor: str) -> None:
        """`candidate` -> version, only if no candidate is out (AliasConflict); READY -> CANDIDATE."""
        move = Move(CANDIDATE, version, None)
        self._apply(
            aliases=[move],
            statuses=[StatusChange(version, VersionStatus.CANDIDATE)],
            events=[_moved(move, reason, actor)],
        )

    def withdraw_candidate(
        self, version: str, *, error: str, reason: str, actor: str, events: Sequence[Any] = ()
    ) -> None:
        """`candidate` version -> nothing, CANDIDATE -> REJECTED with `error`, in one write."""
        move = Move(CANDIDATE, None, version)
        self._apply(
            aliases=[move],
            statuses=[
                StatusChange(version, VersionStatus.REJECTED, error, VersionStatus.CANDIDATE)
            ],
            events=[_moved(move, reason, actor), *events],
        )

    def reject(self, version: str, *, error: str, events: Sequence[Any] = ()) -> None:
        """READY -> REJECTED with `error` (the gate refused), with its events."""
        self._apply(statuses=[StatusChange(version, VersionStatus.REJECTED, error)], events=events)

    def mark_broken(self, version: str, error: str) -> None:
        """Any -> BROKEN: its checkpoint failed to load; aliases stay (serving keeps what it has)."""
        self._apply(statuses=[StatusChange(version, VersionStatus.BROKEN, error)])

    def record(self, *events: Any) -> None:
        """Events on the policy stream that move nothing (fenced like every write)."""
        self._apply(events=events)

    def attach_report(self, version: str, report: dict[str, Any]) -> None:
        self.r.hset(self._key(version), "report", json.dumps(report))

    def _apply(
        self,
        *,
        create: PolicyVersion | None = None,
        aliases: Sequence[Move] = (),
        statuses: Sequence[StatusChange] = (),
        events: Sequence[Any] = (),
    ) -> bool:
        """Run one write atomically; False when `create` exists already, raises on a refusal."""
        names = [s.version for s in statuses] + [m.to for m in aliases if m.to]
        names += [create.version] if create else []
        keys = {v: i + 4 for i, v in enumerate(dict.fromkeys(names))}  # KEYS[4..] in Lua
        write = write_spec(keys, create, aliases, statuses, events)
        all_keys = [POLICY_ALIASES, STREAM_POLICY, POLICY_VERSIONS] + [self._key(v) for v in keys]
        if self.fence is not None:
            all_keys.append(self.fence.key)
            write["fence"] = {"key": len(all_keys), "value": self.fence.value}
        reply = self._write(keys=all_keys, args=[json.dumps(write), RULES, POLICY_CHANNEL])
        return check_reply(*[x.decode() if isinstance(x, bytes) else x for x in reply])


def _moved(move: Move, reason: str, actor: str) -> PolicyAliasMoved:
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
