"""The learner's loop (`Learner`): the lease, the streams into the store, a round when one is
due, the gate and canary after it, and the live status; stops between steps on SIGTERM or
Ctrl-C. `deploy.learn.runner` is the process around it (settings, checks, errors as messages).
"""

from __future__ import annotations

import dataclasses
import logging
import signal
import sqlite3
import threading
import time
from pathlib import Path
from urllib.parse import urlsplit

import redis
from rich.console import Console, Group
from rich.live import Live
from rich.markup import escape
from rich.table import Table

from deploy import redis_conn
from deploy.embedded_redis import ensure_redis
from deploy.learn import integrity
from deploy.learn.lease import LearnerLease, LeaseHeld, holder_name
from deploy.learn.metrics import LearnerTelemetry
from deploy.learn.plan import LearnerConfigError, round_plan
from deploy.learn.ranks import PeerLost, Team
from deploy.learn.round_line import summary_line
from deploy.learn.settings import LearnerSettings
from deploy.learn.trackers import Trackers
from deploy.logs import log_context
from learner.policy.legacy_keys import migrate_legacy_keys
from learner.policy.registry import BASE_VERSION, CANDIDATE, CHAMPION, PolicyRegistry
from learner.publish import recover
from learner.round_updates import RoundAborted
from learner.rounds import RoundResult, run_round
from learner.store import Store
from learner.trajectory_source import TrajectorySource

log = logging.getLogger("arloop.learner")


class Learner:
    """The learner's main loop and its state for the status display."""

    def __init__(
        self, settings: LearnerSettings, console: Console | None = None, world: int = 1
    ) -> None:
        """`world` > 1: rank 0 of a launch, whose other ranks train each round's batches."""
        self.s = settings
        self.console = console or Console()
        self.redis_url = ensure_redis(settings.redis_url, settings.data_dir)
        redis_conn.check_mode(settings.redis_url, settings)
        self.redis = settings.redis_client(self.redis_url)
        redis_conn.claim_shards(self.redis, settings.shards)
        migrate_legacy_keys(self.redis)  # a registry from before the hash tags (plain Redis)
        self.store = Store(Path(settings.data_dir) / "learner" / "store.db")
        self.trackers = Trackers(settings.report_to, Path(settings.data_dir))  # ARLOOP_REPORT_TO
        self.registry = PolicyRegistry(self.redis)  # fenced by the lease once it is taken
        self.lease = LearnerLease(self.redis, holder_name(settings.consumer), settings.lease_s)
        self.source = TrajectorySource(
            self.redis,
            self.store,
            settings.consumer,
            max_deliveries=settings.max_deliveries,
            claim_idle_ms=settings.claim_idle_ms,
            block_ms=settings.read_block_ms,
            count=settings.read_count,
            shards=settings.shards,
        )
        self.plan = round_plan(settings)
        self.team = None
        if world > 1:  # the other ranks wait for our commands from here on
            timeout = settings.collective_timeout_s
            self.team = Team(world, timeout, self._lost_peer, self.console.print)
            self.plan = dataclasses.replace(self.plan, make_trainer=self.team.make_trainer)
        self.telemetry = LearnerTelemetry(
            self.redis, settings.consumer, settings.status_interval_s, shards=settings.shards
        )
        self.telemetry.check_champion = self.champion_problem
        self.release = None
        if settings.gate_packs():
            self.release = self._release_control()
            self.release.on_canary = self.telemetry.canary_checked
        self.stopping = threading.Event()
        self.last: RoundResult | None = None
        self.last_error: str | None = None
        self._last_round = self._last_trim = time.monotonic()
        self._retry_at = 0.0  # after a failed round, wait before the next try

    def _release_control(self):
        """The gate on the agents of ARLOOP_EVAL_PACKS, and the canary (imported only with one)."""
        from deploy.learn.agent_runs import gate_runner
        from learner.gate.control import GateLines, ReleaseControl
        from learner.gate.runner import SuiteMissing

        s, lines = self.s, GateLines(self.console.print)
        try:
            gate = gate_runner(
                s,
                self.redis_url,
                self.registry,
                self.store,
                progress=lines.progress,
                looked=lines.looked,
            )
        except SuiteMissing as exc:
            raise LearnerConfigError(f"{exc}; fix ARLOOP_EVAL_PACKS") from exc
        return ReleaseControl(
            gate,
            self.store,
            s.canary,
            actor=s.consumer,
            say=self.console.print,
            tag=lambda version: log_context(version=version),
        )

    def start(self, once: bool = False) -> bool:
        """The lease, groups, the base version, a rewound registry reconciled, and recovery of
        a publish a crash interrupted; False when stopped while waiting for the lease."""
        if self.registry.exists(BASE_VERSION):  # read only: refused before taking the lease
            self.registry.ensure_base(self.s.base_model)  # BaseModelMismatch: with the fix
        if not self._take_lease(wait=not once):
            return False
        self.source.ensure_groups()
        self.registry.ensure_base(self.s.base_model)  # BaseModelMismatch: refused with the fix
        where = urlsplit(self.redis_url)
        cluster = "cluster " if self.s.redis_cluster else ""
        self.console.print(
            f"learning from redis {cluster}{where.hostname}:{where.port or 6379} as {self.s.consumer} "
            f"(base {self.s.base_model}, data {self.s.data_dir})"
        )
        self._reconcile()
        rec = recover(
            self.store,
            self.registry,
            self.plan.checkpoints_dir,
            self.s.consumer,
            promote=self.release is None,
        )
        for p in rec.registered:
            self.console.print(f"recovered {p.version}: committed before a crash, now registered")
        if self.release is None:
            self.console.print(
                "eval gate off (ARLOOP_EVAL_GATE=false, or ARLOOP_EVAL_PACKS='[]'): each "
                "round's version becomes champion directly"
            )
        else:
            self.console.print(
                f"eval gate: {self.release.gate.suite.name} against "
                f"{self.s.policy_api_base}; canary {'on' if self.s.canary.enabled else 'off'}"
            )
        return True

    def run(self, once: bool = False) -> int:
        """The loop; returns the process exit code."""
        with _stop_on_signals(self.stopping):
            try:
                if not self.start(once):
                    self.console.print("learner stopped while waiting for the lease")
                    return 0
                return self._loop(once)
            finally:
                self.lease.release()
                self.trackers.close()
                if self.team is not None:
                    self.team.close()

    def _loop(self, once: bool) -> int:
        with self._display() as live:
            while not self.stopping.is_set():
                caught_up = self.poll()
                if self.release is not None and not once:
                    self.release.tick()
                if caught_up and (once or self.round_due()):
                    if once and self._canary_pending():
                        self._publish_status()
                        return 0
                    ok = self._round()
                    if once:
                        self._publish_status()
                        return 0 if ok else 1
                self._publish_status()
                if live is not None:
                    self._refresh(live)
        self.console.print("learner stopped")
        return 3 if self.peer_lost else 1 if self.lease_lost else 0

    # -- one learner at a time, and a registry that went back ------------------------------

    lease_lost = False
    peer_lost = False

    def _take_lease(self, wait: bool) -> bool:
        """Hold the lease (waiting for it, or LearnerConfigError when not `wait`)."""
        try:
            taken = integrity.take_lease(
                self.lease, self.registry, self.stopping, self.console.print, wait, self.s.lease_s
            )
        except LeaseHeld as exc:
            raise LearnerConfigError(
                f"{exc}. Stop it first, or run `arloop learn` without --once to take over "
                "when its lease ends"
            ) from None
        if taken:
            self.lease.keep(self._lost_lease)
        return taken

    def _lost_lease(self, reason: str) -> None:
        self.lease_lost = True
        self.last_error = f"lost the learner lease: {reason}; stopping, nothing more published"
        self.console.print(f"[red]{self.last_error}[/]")
        log.error(self.last_error)
        self.stopping.set()

    def _lost_peer(self, reason: str) -> None:
        self.peer_lost = True  # the team printed why
        self.last_error = reason
        self.stopping.set()

    def _reconcile(self) -> None:
        """A registry that lost versions this learner registered: said, and undone here."""
        said = integrity.reconcile_rewind(
            self.store, self.registry, self.plan.checkpoints_dir, self.s.consumer
        )
        if said is not None:
            self.last_error = said[0]
            for line in said:
                self.console.print(f"[red]{line}[/]")
            log.error(said[0])

    def champion_problem(self) -> str | None:
        """Why the champion cannot load (for /healthz), or None."""
        return integrity.champion_problem(self.registry)

    # -- the steps -------------------------------------------------------------------------

    def poll(self) -> bool:
        """One batch from the streams into the store (and a trim now and then); caught up?"""
        try:
            result = self.source.poll()
            self.source.forget()  # after the poll: what it read of an erased user goes too
            if time.monotonic() - self._last_trim > self.s.trim_interval_s:
                self.source.trim()
                self._last_trim = time.monotonic()
        except (redis.RedisError, sqlite3.Error) as exc:  # entries stay pending: retried later
            self.last_error = f"reading the streams: {exc}"
            log.warning(self.last_error)
            time.sleep(1.0)
            return False
        return result.caught_up

    def _canary_pending(self) -> bool:
        """`--once` while a candidate is out: the canary checked, and said so (no round)."""
        message = self.release.pending_canary() if self.release is not None else None
        if message:
            self.console.print(f"[yellow]{escape(message)}[/]")
        return message is not None

    def _trainable(self) -> int:
        c = self.store.open_counts(time.time(), self.s.round.feedback_window_s)
        silence_trains = self.s.round.silence_reward is not None
        return c["with_feedback"] + (c["window_closed"] if silence_trains else 0)

    def round_due(self) -> bool:
        if time.monotonic() < self._retry_at:
            return False
        if self.release is not None and self.release.canary_active():
            return False  # one candidate at a time: learning resumes once the canary decides
        waiting = self._trainable()
        interval = time.monotonic() - self._last_round >= self.s.round_interval_s
        return waiting >= self.s.min_episodes or (waiting > 0 and interval)

    def _round(self) -> bool:
        """One round; errors are reported and the loop goes on (the events stay trainable)."""
        self._last_round = time.monotonic()
        try:
            self._reconcile()  # Redis may have been rewound since the last round
            result = run_round(
                self.store,
                self.registry,
                self.plan,
                should_stop=self.stopping.is_set,
                say=self.console.print,
            )
        except RoundAborted as exc:
            self.console.print(str(exc))
            return False
        except PeerLost:
            raise  # the launch is broken: main says so and exits
        except Exception as exc:  # noqa: BLE001 - reported; the episodes stay trainable
            self.telemetry.metrics.rounds.labels("failed").inc()
            self.last_error = f"round failed: {exc}"
            self.console.print(f"[red]{self.last_error}[/]")
            log.exception("round failed")
            self._retry_at = time.monotonic() + min(self.s.round_interval_s, 60.0)
            return False
        finally:
            if self.team is not None:
                self.team.round_over()
        if result is None:
            self.telemetry.metrics.rounds.labels("none").inc()
            self.console.print("nothing trainable: no round")
            return True
        self.last = result
        self.telemetry.round_done(result.version, result.metrics, result.seconds)
        self.trackers.log(result.version, result.metrics, result.seconds)
        self.console.print(summary_line(result))
        if result.published.conflict:
            self.console.print(f"[yellow]{result.published.conflict}[/]")
        if self.release is not None:
            self.release.after_round(result.version)
        return True

    def _publish_status(self) -> None:
        """The metrics' stream figures and the dashboard's status key, when due."""
        self.telemetry.error = self.last_error
        if self.release is not None:
            self.telemetry.release = self.release.last
        try:
            self.telemetry.refresh(force=False)
        except redis.RedisError as exc:
            self.last_error = f"redis: {exc}"

    # -- display ---------------------------------------------------------------------------

    def status_view(self) -> Table:
        """The live status: stream backlog, episodes, dead letters, champion, last round."""
        c = self.store.open_counts(time.time(), self.s.round.feedback_window_s)
        counts = self.store.counts()
        let_go = {
            k.split("/")[1]: v for k, v in counts.items() if not k.endswith(("open", "trained"))
        }
        table = Table(title="arloop learn", show_header=False, box=None)
        table.add_row("pending in redis", str(self.source.pending()))
        table.add_row(
            "episodes",
            f"{c['with_feedback']} with feedback, {c['waiting']} waiting, "
            f"{c['window_closed']} window closed",
        )
        table.add_row(
            "trained events",
            str(counts.get("trajectories/trained", 0) + counts.get("feedback/trained", 0)),
        )
        table.add_row("let go", ", ".join(f"{k} {v}" for k, v in sorted(let_go.items())) or "-")
        table.add_row("dead letters", str(self.source.dead_total))
        aliases = self.registry.aliases()
        table.add_row("champion", aliases.get(CHAMPION, "-"))
        if self.release is not None:
            table.add_row("candidate", aliases.get(CANDIDATE, "-"))
            table.add_row("release", self.release.last or "-")
        table.add_row("last round", summary_line(self.last) if self.last else "-")
        if self.last_error:
            table.add_row("last error", f"[red]{self.last_error}[/]")
        return table

    def _refresh(self, live: Live) -> None:
        try:
            live.update(self.status_view())
        except redis.RedisError as exc:
            self.last_error = f"redis: {exc}"

    def _display(self):
        if not self.console.is_terminal:
            return _NoLive()
        return Live(Group(self.status_view()), console=self.console, refresh_per_second=2)


class _NoLive:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


class _stop_on_signals:
    """SIGTERM and the first Ctrl-C set `stop`; a second Ctrl-C interrupts at once."""

    def __init__(self, stop: threading.Event) -> None:
        self.stop = stop
        self.saved: dict[int, object] = {}

    def _handler(self, signum: int, frame: object) -> None:
        self.stop.set()
        signal.signal(signal.SIGINT, signal.default_int_handler)

    def __enter__(self) -> None:
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                self.saved[sig] = signal.signal(sig, self._handler)

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self.saved.items():
            signal.signal(sig, handler)
