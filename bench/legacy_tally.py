"""The agent API's live tallies as they were before they were bounded and scoped (issue 36,
item 7): the peer arm of `bench/bench_agent_api_memory.py`.

Every rated run id kept in a set, every version and card kept, XRANGE batches of 1,000 entries,
all tenants counted together (the tenant arguments are taken and ignored).
"""

from __future__ import annotations

import threading
from collections import defaultdict
from typing import Any

import redis

from agents.events import (
    STREAM_EVAL_TRAJECTORIES,
    STREAM_FEEDBACK,
    STREAM_TRAJECTORIES,
    EventDecodeError,
    FeedbackEvent,
    FeedbackKind,
    TrajectoryEvent,
    decode,
)
from deploy.agent_api import report_card as rc
from deploy.agent_api.traffic import CardCounts, VersionTraffic

BATCH = 1000


class LegacyTally:
    """Per-version traffic and per agent-and-version report card counts, over all tenants."""

    def __init__(self, tenants: Any = (), max_entries: int = 50_000) -> None:
        self.max_entries = max_entries
        self.versions: dict[str, VersionTraffic] = defaultdict(VersionTraffic)
        self.cards: dict[tuple[str, str], CardCounts] = defaultdict(CardCounts)
        self._rated: set[str] = set()
        self._cursor = {
            s: "-" for s in (STREAM_TRAJECTORIES, STREAM_FEEDBACK, STREAM_EVAL_TRAJECTORIES)
        }
        self._lock = threading.Lock()

    def refresh(self, client: redis.Redis) -> None:
        with self._lock:
            for stream in self._cursor:
                self._read(client, stream)

    def _read(self, client: redis.Redis, stream: str) -> None:
        budget = self.max_entries
        while budget > 0:
            batch = client.xrange(stream, min=self._cursor[stream], count=min(BATCH, budget))
            for entry_id, fields in batch:
                self._cursor[stream] = "(" + _s(entry_id)
                self._take(stream, fields)
            budget -= len(batch)
            if len(batch) < BATCH:
                return

    def _take(self, stream: str, fields: dict) -> None:
        try:
            event = decode(fields)
        except EventDecodeError:
            return
        if isinstance(event, TrajectoryEvent):
            if stream == STREAM_TRAJECTORIES and rc.stress_case(event) is None:
                self.versions[event.policy_version].runs += 1
            if stream == STREAM_TRAJECTORIES or rc.stress_case(event) is not None:
                self.cards[(event.agent, event.policy_version)].add(event)
        elif isinstance(event, FeedbackEvent) and event.source == "user":
            mine = self.versions[event.policy_version]
            mine.feedback += 1
            if event.trajectory_id not in self._rated:
                self._rated.add(event.trajectory_id)
                mine.rated += 1
            if event.kind is FeedbackKind.THUMBS:
                mine.thumbs_up += event.value == 1
                mine.thumbs_down += event.value == -1

    def traffic(self, tenant: str = "") -> dict[str, dict[str, Any]]:
        with self._lock:
            return {v: t.view() for v, t in self.versions.items()}

    def report_card(self, tenant: str = "") -> list[dict[str, Any]]:
        with self._lock:
            return [
                {"agent": agent, "version": version, **card.view()}
                for (agent, version), card in sorted(self.cards.items())
            ]


def install() -> None:
    """Make the agent API build its tally as before (call before the app starts)."""
    from deploy.agent_api import services

    services.Tally = LegacyTally


def _s(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
