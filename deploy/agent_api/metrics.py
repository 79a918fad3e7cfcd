"""Prometheus metrics of the agent API (one registry per app, so instances do not clash)."""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

from agents.events import TrajectoryEvent


class ApiMetrics:
    """Runs, model and tool calls, feedback and errors, in one vocabulary."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.runs = Counter("arloop_runs", "Finished agent runs.", ["agent", "status"], registry=r)
        self.run_seconds = Histogram(
            "arloop_run_seconds",
            "Agent run wall time.",
            ["agent"],
            registry=r,
            buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120),
        )
        self.model_calls = Counter(
            "arloop_model_calls", "Policy calls.", ["agent", "policy_version"], registry=r
        )
        self.tool_calls = Counter(
            "arloop_tool_calls", "Tool calls.", ["agent", "tool", "error"], registry=r
        )
        self.feedback = Counter(
            "arloop_feedback", "Feedback submissions.", ["kind", "outcome"], registry=r
        )
        self.errors = Counter("arloop_http_errors", "Error answers.", ["status"], registry=r)
        self._feedback: dict[tuple[str, str], Any] = {}
        self.streams = Counter(
            "arloop_run_streams",
            "Streamed runs by how they ended: completed, error, cancelled (client left).",
            ["outcome"],
            registry=r,
        )

        self.external_runs = Counter(
            "arloop_external_runs",
            "Runs of /v1/chat/completions calls by how they closed: ended, idle, cancelled.",
            ["closed_by"],
            registry=r,
        )
        self.text_only_runs = Counter(
            "arloop_text_only_runs",
            "Runs logged without token ids (an endpoint that gives none): not trainable.",
            ["agent"],
            registry=r,
        )

    def feedback_counted(self, kind: str, outcome: str):
        """The feedback counter of (kind, outcome), looked up once (the ingest path's)."""
        child = self._feedback.get((kind, outcome))
        if child is None:
            child = self._feedback[(kind, outcome)] = self.feedback.labels(kind, outcome)
        return child

    def observe_run(self, event: TrajectoryEvent) -> None:
        self.runs.labels(event.agent, event.status.value).inc()
        self.run_seconds.labels(event.agent).observe(event.finished_at - event.started_at)
        for step in event.model_steps:
            self.model_calls.labels(event.agent, step.policy_version).inc()
        for step in event.tool_steps:
            name = "unknown" if step.error == "unknown_tool" else step.name  # bounded labels
            self.tool_calls.labels(event.agent, name, step.error or "none").inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)
