"""Live traffic per policy version, and the report card's counts, read from the streams.

`Tally.refresh` reads only what was added since its last call (XRANGE after a cursor per
stream, at most `max_entries` a call), so a dashboard polling every few seconds costs little.
Each agent API process keeps its own tally from the start of the streams (what the learner has
not trimmed yet). Feedback carries the version that answered (from its signed token), so the
per-version figures need no join: a run is "rated" when any feedback names it.
"""

from __future__ import annotations

import threading
from collections import defaultdict
from dataclasses import asdict, dataclass, field
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

BATCH = 1000


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
            "feedback_rate": self.rated / self.runs if self.runs else None,
            "thumbs_up_rate": self.thumbs_up / thumbs if thumbs else None,
        }


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
        }


def _rate(hits: int, n: int) -> dict[str, Any]:
    return {"hits": hits, "n": n, "rate": hits / n if n else None}


class Tally:
    """Per-version traffic and per agent-and-version report card counts, kept up to date."""

    def __init__(self, max_entries: int = 50_000) -> None:
        self.max_entries = max_entries
        self.versions: dict[str, VersionTraffic] = defaultdict(VersionTraffic)
        self.cards: dict[tuple[str, str], CardCounts] = defaultdict(CardCounts)
        self._rated: set[str] = set()
        self._cursor = {
            s: "-" for s in (STREAM_TRAJECTORIES, STREAM_FEEDBACK, STREAM_EVAL_TRAJECTORIES)
        }
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
                self._cursor[stream] = "(" + _s(entry_id)
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

    def traffic(self) -> dict[str, dict[str, Any]]:
        with self._lock:
            return {v: t.view() for v, t in self.versions.items()}

    def report_card(self) -> list[dict[str, Any]]:
        with self._lock:
            return [
                {"agent": agent, "version": version, **card.view()}
                for (agent, version), card in sorted(self.cards.items())
            ]


def _s(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
