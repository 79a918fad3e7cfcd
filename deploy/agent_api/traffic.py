"""Live traffic per policy version, and the report card's counts, read from the streams, per
tenant and in bounded memory.

`Tally.refresh` reads only what was added since its last call (XRANGE after a cursor per
stream, every shard's, `BATCH` entries at a time, at most `max_entries` a stream and call), so
a dashboard polling every few seconds costs little and a poll holds at most `BATCH` entries at
once. Each agent API process keeps its own tally from the start of the streams (what
retention has left). Feedback carries the version that answered (from its signed token), so the
per-version figures need no join.

Whose figures: a run and its feedback count for the tenant of their stored user
(`deploy.credentials.tenant_of`); only the tenants of the API's keys are kept, and a caller is
shown its own tenant's. Stress cases (`arloop stress`, synthetic runs on the eval stream) are
the deployment's, shown to every tenant with the registry.

What memory they take, whatever the traffic:
- per tenant, at most `MAX_VERSIONS` versions and `MAX_CARDS` agent-and-version cards: the
  least recently active goes first, and starts again from zero if it comes back; a card
  counts at most `MAX_NODES` graph nodes by name (a client names them), the rest together;
- a run is "rated" when any user feedback names it. The ids of the latest `RATED_WINDOW`
  rated runs are kept (`RecentIds`, about 8 bytes an id): a run rated again after more than
  that many other runs were rated since its first feedback counts as rated twice (feedback
  comes soon after its run; at 10 rated runs a second that is 1.8 hours later).
"""

from __future__ import annotations

import bisect
import threading
from array import array
from collections import deque
from collections.abc import Callable, Collection, Iterator
from dataclasses import asdict, dataclass, field
from typing import Any, Generic, TypeVar

import redis

from agents.events import (
    ONE_SHARD,
    STREAM_EVAL_TRAJECTORIES,
    EventDecodeError,
    FeedbackEvent,
    FeedbackKind,
    StreamShards,
    TrajectoryEvent,
    as_text,
    decode,
)
from deploy.agent_api import report_card as rc
from deploy.credentials import DEFAULT_TENANT, tenant_of

BATCH = 100
"""Entries one XRANGE reads: a run can be tens of kilobytes, and a batch's decoded events are
all in memory at once (1,000 grew the process by megabytes a poll)."""
MAX_VERSIONS = 64
MAX_CARDS = 256
RATED_WINDOW = 65_536
RATED_CHUNK = 4_096


@dataclass
class VersionTraffic:
    """What one version's live traffic got."""

    runs: int = 0
    rated: int = 0  # runs with any feedback
    feedback: int = 0  # feedback events
    thumbs_up: int = 0
    thumbs_down: int = 0

    def view(self) -> dict[str, Any]:
        thumbs = self.thumbs_up + self.thumbs_down
        return asdict(self) | {
            "feedback_rate": min(1.0, self.rated / self.runs) if self.runs else None,
            "thumbs_up_rate": self.thumbs_up / thumbs if thumbs else None,
        }


MAX_NODES = 32
"""Graph nodes a report card counts by name, per agent and version; more: `OTHER_NODES`."""
OTHER_NODES = "(other)"


@dataclass
class CardCounts:
    """The report card's counts for one agent and version (rules: `report_card`)."""

    runs: int = 0
    goal_consistent: int = 0
    tool_error_runs: int = 0
    recovered: int = 0
    retried: int = 0
    retry_fixed: int = 0
    stress: dict[str, list[int]] = field(default_factory=dict)  # case -> [runs, passed]
    nodes: dict[str, list[float]] = field(default_factory=dict)
    """Graph node (`ModelStep.node`) -> [calls, calls that asked for tools, latency ms summed];
    at most `MAX_NODES` names, the rest counted under `OTHER_NODES` (names come from clients)."""

    def add(self, t: TrajectoryEvent) -> None:
        case = rc.stress_case(t)
        if case is not None:
            seen = self.stress.setdefault(case, [0, 0])
            seen[0] += 1
            seen[1] += rc.stress_passed(t)
            return
        self.runs += 1
        self.goal_consistent += rc.goal_consistent(t)
        if rc.had_tool_error(t):
            self.tool_error_runs += 1
            self.recovered += rc.recovered(t)
        if rc.retried(t):
            self.retried += 1
            self.retry_fixed += rc.retry_fixed(t)
        for step in t.model_steps:
            if step.node is not None:
                name = (
                    step.node
                    if step.node in self.nodes or len(self.nodes) < MAX_NODES
                    else OTHER_NODES
                )
                seen = self.nodes.setdefault(name, [0, 0, 0.0])
                seen[0] += 1
                seen[1] += bool(step.tool_calls)
                seen[2] += step.latency_ms

    def view(self) -> dict[str, Any]:
        return {
            "runs": self.runs,
            "goal_consistency": _rate(self.goal_consistent, self.runs),
            "error_recovery": _rate(self.recovered, self.tool_error_runs),
            "self_reflection": _rate(self.retry_fixed, self.retried),
            "stress": {
                case: {"runs": n, "passed": ok, "rate": ok / n if n else None}
                for case, (n, ok) in sorted(self.stress.items())
            },
            "nodes": {
                node: {"calls": int(n), "tool_calls": int(k), "latency_ms": ms / n}
                for node, (n, k, ms) in sorted(self.nodes.items())
            },
        }


def _rate(hits: int, n: int) -> dict[str, Any]:
    return {"hits": hits, "n": n, "rate": hits / n if n else None}


K = TypeVar("K")
V = TypeVar("V")


class Recent(Generic[K, V]):
    """A dict of at most `cap` entries: the least recently touched one goes first."""

    def __init__(self, cap: int, factory: Callable[[], V]) -> None:
        self.cap, self.factory = cap, factory
        self._items: dict[K, V] = {}

    def touch(self, key: K) -> V:
        """The entry of `key` (made if new), now the most recent."""
        value = self._items.pop(key, None)
        if value is None:
            value = self.factory()
            if len(self._items) >= self.cap:
                del self._items[next(iter(self._items))]
        self._items[key] = value
        return value

    def get(self, key: K) -> V | None:
        return self._items.get(key)

    def items(self) -> Iterator[tuple[K, V]]:
        return iter(list(self._items.items()))

    def __len__(self) -> int:
        return len(self._items)


class RecentIds:
    """Whether an id is among the last `window` added (and up to `chunk` more), in about 8 bytes
    an id: the newest as a set of their 64-bit hashes, the older ones as sorted arrays of
    `chunk` hashes (two ids share a hash with a chance of about window² / 2^65: 1e-10 at
    65,536)."""

    def __init__(self, window: int = RATED_WINDOW, chunk: int = RATED_CHUNK) -> None:
        self.chunk = chunk
        self._new: set[int] = set()
        self._old: deque[array] = deque(maxlen=-(-window // chunk))

    def add(self, item: str) -> bool:
        """Remember `item`; False when it was already there."""
        key = hash(item)
        if key in self._new or any(_holds(old, key) for old in self._old):
            return False
        self._new.add(key)
        if len(self._new) >= self.chunk:
            self._old.append(array("q", sorted(self._new)))
            self._new = set()
        return True

    def __len__(self) -> int:
        return len(self._new) + sum(len(old) for old in self._old)

    def nbytes(self) -> int:
        """What the hashes take (the set's table included), bytes."""
        return self._new.__sizeof__() + 32 * len(self._new) + sum(a.__sizeof__() for a in self._old)


def _holds(sorted_keys: array, key: int) -> bool:
    i = bisect.bisect_left(sorted_keys, key)
    return i < len(sorted_keys) and sorted_keys[i] == key


class TenantFigures:
    """One tenant's live traffic per version and report-card counts per agent and version."""

    def __init__(self) -> None:
        self.versions: Recent[str, VersionTraffic] = Recent(MAX_VERSIONS, VersionTraffic)
        self.cards: Recent[tuple[str, str], CardCounts] = Recent(MAX_CARDS, CardCounts)


class Tally:
    """Per tenant: per-version traffic and per agent-and-version report card counts, kept up
    to date from the streams (see the module docstring for what it keeps)."""

    def __init__(
        self,
        tenants: Collection[str] = (DEFAULT_TENANT,),
        max_entries: int = 50_000,
        rated_window: int = RATED_WINDOW,
        shards: StreamShards = ONE_SHARD,
    ) -> None:
        self.max_entries = max_entries
        self.tenants = {t: TenantFigures() for t in tenants}
        self.stress: Recent[tuple[str, str], CardCounts] = Recent(MAX_CARDS, CardCounts)
        self.rated = RecentIds(rated_window)
        self._runs = shards.all_trajectories()  # live runs; the eval stream's are stress cases
        streams = (*self._runs, *shards.all_feedback(), STREAM_EVAL_TRAJECTORIES)
        self._cursor = dict.fromkeys(streams, "-")
        self._lock = threading.Lock()

    def refresh(self, client: redis.Redis) -> None:
        """Take in what the streams gained since the last call (blocking: run it in a thread)."""
        with self._lock:
            for stream in self._cursor:
                self._read(client, stream)

    def _read(self, client: redis.Redis, stream: str) -> None:
        budget = self.max_entries
        while budget > 0:
            batch = client.xrange(stream, min=self._cursor[stream], count=min(BATCH, budget))
            for entry_id, fields in batch:
                self._cursor[stream] = "(" + as_text(entry_id)
                self._take(stream, fields)
            budget -= len(batch)
            if len(batch) < BATCH:
                return

    def _take(self, stream: str, fields: dict) -> None:
        try:
            event = decode(fields)
        except EventDecodeError:
            return  # a poison entry: the learner dead-letters it
        if isinstance(event, TrajectoryEvent):
            self._take_run(stream, event)
        elif isinstance(event, FeedbackEvent) and event.source == "user":
            self._take_feedback(event)

    def _take_run(self, stream: str, event: TrajectoryEvent) -> None:
        key = (event.agent, event.policy_version)
        if rc.stress_case(event) is not None:
            self.stress.touch(key).add(event)
            return
        mine = self.tenants.get(tenant_of(event.user_id))
        if stream in self._runs and mine is not None:
            mine.versions.touch(event.policy_version).runs += 1
            mine.cards.touch(key).add(event)

    def _take_feedback(self, event: FeedbackEvent) -> None:
        mine = self.tenants.get(tenant_of(event.user_id))
        if mine is None:
            return
        traffic = mine.versions.touch(event.policy_version)
        traffic.feedback += 1
        traffic.rated += self.rated.add(event.trajectory_id)
        if event.kind is FeedbackKind.THUMBS:
            traffic.thumbs_up += event.value == 1
            traffic.thumbs_down += event.value == -1

    def traffic(self, tenant: str = DEFAULT_TENANT) -> dict[str, dict[str, Any]]:
        """Version -> the tenant's live traffic on it."""
        with self._lock:
            mine = self.tenants.get(tenant)
            return {v: t.view() for v, t in mine.versions.items()} if mine else {}

    def report_card(self, tenant: str = DEFAULT_TENANT) -> list[dict[str, Any]]:
        """Per agent and version: the tenant's runs by the card's rules, and the stress cases."""
        with self._lock:
            mine = self.tenants.get(tenant)
            cards = dict(mine.cards.items()) if mine else {}
            stress = dict(self.stress.items())
            out = []
            for agent, version in sorted(cards.keys() | stress.keys()):
                card = cards.get((agent, version)) or CardCounts()
                cases = stress.get((agent, version)) or CardCounts()
                view = card.view() | {"stress": cases.view()["stress"]}
                out.append({"agent": agent, "version": version, **view})
            return out
