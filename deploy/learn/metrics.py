"""The learner's Prometheus metrics, its `/metrics` and `/healthz`, and its status in Redis.

Every `status_interval_s` the loop calls `LearnerTelemetry.refresh`: the stream figures
(`deploy.stream_stats`) become gauges and, with the last round and the canary's state, the JSON
under `arloop:learner:status` that the agent API's dashboard reads (the agent API imports no
learner code: this key is the contract). A round's metrics (TRL's names) become
`arloop_learner_*` gauges when it ends.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import redis
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    generate_latest,
)

from agents.events import LEARNER_STATUS, ONE_SHARD, StreamShards
from deploy.stream_stats import all_stats

log = logging.getLogger("arloop.learner")

ROUND_GAUGES = {
    "reward": "reward",
    "reward_std": "reward_std",
    "kl": "kl",
    "entropy": "entropy",
    "clip_ratio": "clip_ratio",
    "completions/mean_length": "completions_mean_length",
    "loss": "loss",
    "frac_reward_zero_std": "frac_reward_zero_std",
    "untrainable/no_token_ids": "untrainable_no_token_ids",
    "memory/peak_rss_mb": "peak_rss_mb",
}
"""Round metric (TRL's name where TRL has one) -> the suffix of its `arloop_learner_<suffix>`
gauge."""


class LearnerMetrics:
    """Rounds, their metrics, the streams' lag, pending and dead letters, the canary."""

    def __init__(self) -> None:
        self.registry = r = CollectorRegistry()
        self.rounds = Counter(
            "arloop_learner_rounds",
            "Rounds by outcome (published, none, failed).",
            ["outcome"],
            registry=r,
        )
        self.round_seconds = Gauge(
            "arloop_learner_round_seconds", "Wall time of the last round.", registry=r
        )
        self.round = {
            name: Gauge(f"arloop_learner_{suffix}", f"Last round's {name}.", registry=r)
            for name, suffix in ROUND_GAUGES.items()
        }
        self.stream_length = _g("stream_length", "Entries in the stream.", r)
        self.stream_lag = _g("stream_lag", "Entries not yet delivered to the learner.", r)
        self.stream_lag_seconds = _g(
            "stream_lag_seconds", "Age of the oldest entry not yet delivered.", r
        )
        self.stream_pending = _g("stream_pending", "Delivered, not yet acknowledged.", r)
        self.trimmed_unread = _g(
            "trimmed_unread",
            "Entries retention dropped before the learner read them (ARLOOP_STREAM_MAX_ENTRIES; "
            "Redis 7+), while the gap lasts.",
            r,
        )
        self.dead_letters = Gauge(
            "arloop_learner_dead_letters", "Entries in the dead-letter stream.", registry=r
        )
        self.canary = Gauge(
            "arloop_learner_canary",
            "The canary's figures (n_champion, n_candidate, diff, "
            "ci_low, ci_high); absent without a canary.",
            ["figure"],
            registry=r,
        )

    def observe_round(self, metrics: dict[str, float], seconds: float) -> None:
        self.rounds.labels("published").inc()
        self.round_seconds.set(seconds)
        for name, gauge in self.round.items():
            if name in metrics:
                gauge.set(metrics[name])

    def observe_streams(self, stats: dict[str, Any]) -> None:
        for s in stats["streams"]:
            self.stream_length.labels(s["stream"]).set(s["length"])
            self.stream_lag.labels(s["stream"]).set(s["lag"])
            self.stream_lag_seconds.labels(s["stream"]).set(s["lag_seconds"])
            self.stream_pending.labels(s["stream"]).set(s["pending"])
            if s.get("trimmed_unread") is not None:
                self.trimmed_unread.labels(s["stream"]).set(s["trimmed_unread"])
        self.dead_letters.set(stats["dead_letters"])

    def observe_canary(self, canary: dict[str, Any] | None) -> None:
        self.canary.clear()
        for figure in ("n_champion", "n_candidate", "diff", "ci_low", "ci_high"):
            if canary is not None:
                self.canary.labels(figure).set(canary[figure])

    def render(self) -> bytes:
        return generate_latest(self.registry)


def _g(suffix: str, doc: str, registry: CollectorRegistry) -> Gauge:
    return Gauge(f"arloop_learner_{suffix}", doc, ["stream"], registry=registry)


class LearnerTelemetry:
    """The metrics, and the status JSON the learner keeps in Redis for the dashboard."""

    def __init__(
        self,
        client: redis.Redis,
        consumer: str,
        interval_s: float,
        shards: StreamShards = ONE_SHARD,
    ) -> None:
        self.client, self.consumer, self.interval_s = client, consumer, interval_s
        self.shards = shards  # every shard's streams are reported
        self.metrics = LearnerMetrics()
        self.last_round: dict[str, Any] | None = None
        self.canary: dict[str, Any] | None = None
        self.release: str | None = None
        self.error: str | None = None
        self.check_champion: Callable[[], str | None] | None = None
        """Why the champion cannot load (None: it can), asked at each refresh."""
        self.champion_problem: str | None = None
        self._next = 0.0
        self._trimmed: dict[str, int | None] = {}  # stream -> trimmed_unread last reported

    def round_done(self, version: str, metrics: dict[str, float], seconds: float) -> None:
        self.metrics.observe_round(metrics, seconds)
        self.last_round = {"version": version, "seconds": seconds, "at": time.time()} | {
            "metrics": {k: v for k, v in metrics.items() if k in ROUND_GAUGES}
        }
        self._next = 0.0  # publish now

    def canary_checked(self, check: Any) -> None:
        """A `learner.gate.canary.CanaryCheck` (None: no canary out)."""
        if check is None:
            self.canary = None
        else:
            d = check.decision
            self.canary = {
                "candidate": check.candidate,
                "champion": check.champion,
                "started_at": check.started_at,
                "action": check.action,
                "n_champion": d.n_champion,
                "n_candidate": d.n_candidate,
                "diff": d.diff,
                "ci_low": d.ci_low,
                "ci_high": d.ci_high,
                "test": d.test,
                "at": time.time(),
            }
        self.metrics.observe_canary(self.canary)

    def refresh(self, force: bool = False) -> None:
        """Stream figures into the gauges and the status into Redis, every `interval_s`."""
        now = time.monotonic()
        if not force and now < self._next:
            return
        self._next = now + self.interval_s
        stats = all_stats(self.client, self.shards)
        self.metrics.observe_streams(stats)
        for s in stats["streams"]:  # said once per gap, not at every refresh while it lasts
            trimmed = s.get("trimmed_unread")
            if trimmed and trimmed != self._trimmed.get(s["stream"]):
                log.warning(
                    "%s: %d entries were dropped by retention before the learner read them "
                    "(ARLOOP_STREAM_MAX_ENTRIES): the learner fell that far behind",
                    s["stream"],
                    trimmed,
                )
            self._trimmed[s["stream"]] = trimmed
        if self.check_champion is not None:
            self.champion_problem = self.check_champion()
        status = {
            "consumer": self.consumer,
            "updated_at": time.time(),
            **stats,
            "last_round": self.last_round,
            "canary": self.canary,
            "release": self.release,
            "last_error": self.error,
            "champion_problem": self.champion_problem,
        }
        self.client.set(LEARNER_STATUS, json.dumps(status))


def _health(telemetry: LearnerTelemetry) -> tuple[int, bytes]:
    """503 when the champion cannot load (serving is broken whatever the learner does),
    `degraded` with the last error, else ok."""
    if telemetry.champion_problem is not None:
        status, code = "unhealthy", 503
    else:
        status, code = ("ok", 200) if telemetry.error is None else ("degraded", 200)
    body = {
        "status": status,
        "last_error": telemetry.error,
        "champion_problem": telemetry.champion_problem,
    }
    return code, json.dumps(body).encode()


def serve_metrics(telemetry: LearnerTelemetry, host: str, port: int) -> ThreadingHTTPServer:
    """`/metrics` (Prometheus) and `/healthz` on a daemon thread; OSError if the port is taken."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            if self.path.split("?")[0] == "/metrics":
                self._send(200, telemetry.metrics.render(), CONTENT_TYPE_LATEST)
            elif self.path.split("?")[0] == "/healthz":
                self._send(*_health(telemetry), "application/json")
            else:
                self._send(
                    404, b'{"detail": "not found: /metrics or /healthz"}', "application/json"
                )

        def _send(self, status: int, body: bytes, kind: str) -> None:
            self.send_response(status)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:  # scrapes are not worth a log line
            return

    server = ThreadingHTTPServer((host, port), Handler)
    threading.Thread(target=server.serve_forever, name="learner-metrics", daemon=True).start()
    return server
