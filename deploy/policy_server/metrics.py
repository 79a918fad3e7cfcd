"""Prometheus metrics of the policy server, in their own registry (one per app)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram


class PolicyMetrics:
    """Requests, tokens, batch sizes, admission, loads and the version each alias serves."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "arloop_policy_requests",
            "Chat completion requests by HTTP status.",
            ["code"],
            registry=r,
        )
        self.prompt_tokens = Counter("arloop_policy_prompt_tokens", "Prompt tokens.", registry=r)
        self.generated_tokens = Counter(
            "arloop_policy_generated_tokens",
            "Completion tokens generated.",
            ["version"],
            registry=r,
        )
        self.batch_rows = Histogram(
            "arloop_policy_batch_rows",
            "Rows (samples) per batched forward pass.",
            buckets=(1, 2, 3, 4, 6, 8, 12, 16, 32),
            registry=r,
        )
        self.request_seconds = Histogram(
            "arloop_policy_request_seconds", "Time to the full response.", registry=r
        )
        self.running_rows = Gauge(
            "arloop_policy_running_rows",
            "Rows (choices) of the requests admitted to the engine.",
            registry=r,
        )
        self.queued_tokens = Gauge(
            "arloop_policy_queued_tokens",
            "Tokens (n x max_tokens plus the prompt) of the requests waiting for the engine.",
            registry=r,
        )
        self.refused = Counter(
            "arloop_policy_refused",
            "Requests answered 503 by admission: queue_full, queue_timeout, shutting_down.",
            ["reason"],
            registry=r,
        )
        self.cancelled = Counter(
            "arloop_policy_cancelled",
            "Requests whose generation was cancelled: client_gone, shutdown.",
            ["reason"],
            registry=r,
        )
        self.loads = Counter("arloop_policy_version_loads", "Versions loaded.", registry=r)
        self.load_failures = Counter(
            "arloop_policy_load_failures", "Versions whose checkpoint failed to load.", registry=r
        )
        self.loaded_versions = Gauge(
            "arloop_policy_loaded_versions",
            "Versions whose weights are in memory (retiring ones too).",
            registry=r,
        )
        self.serving = Gauge(
            "arloop_policy_serving",
            "1 for the version each alias serves.",
            ["alias", "version"],
            registry=r,
        )

    def set_serving(self, aliases: dict[str, str]) -> None:
        """Replace the serving gauge with the current alias -> version map."""
        self.serving.clear()
        for alias, version in aliases.items():
            self.serving.labels(alias=alias, version=version).set(1)
