"""Release control inside `arloop learn`: gate each new version, run the canary, act on both.

After a round publishes vN as READY, the gate evaluates it against the champion
(`learner/gate/runner.py`) and `learner.gate.release.apply_verdict` rejects it, or makes it the
candidate (canary), or the champion (canary off). While a candidate is out no new round
starts; every `canary.check_s` the controller (`learner/gate/canary.py`) compares live feedback
per arm and promotes or rolls back. A version whose gate could not judge (policy server down)
stays READY and is gated again later, so a crash or an outage never skips the gate; after
`GateConfig.error_attempts` such tries, each further apart, it is rejected (fail closed): a
version that cannot be judged is never released, and the learner stops spending gates on it.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext

from learner.gate import canary
from learner.gate.eval_gate import ERROR, GateReport, refuse
from learner.gate.release import ReleaseError, apply_verdict, reject
from learner.gate.runner import GateRunner
from learner.gate.sequential import SequentialResult
from learner.policy.registry import CANDIDATE, CHAMPION, AliasConflict, VersionStatus
from learner.store import Store

log = logging.getLogger("arloop.release")

RETRY_FIRST_S, RETRY_MAX_S = 30.0, 1800.0
"""A gate that could not judge is tried again after 30 s, then twice as long each time."""

Say = Callable[[str], None]
"""Where a line for people goes (`arloop learn` prints it on its console)."""


class GateLines:
    """The gate's progress as plain lines: its eval runs in fifths, each look of its test
    (`arloop learn` prints them; the demo shows the learner's latest line)."""

    def __init__(self, say: Say) -> None:
        self.say = say

    def progress(self, what: str, done: int, total: int) -> None:
        if done == total or done % max(1, total // 5) == 0:
            self.say(f"  gate: {what} runs {done}/{total}")

    def looked(self, test: SequentialResult) -> None:
        look = test.looks[-1]
        self.say(
            f"  gate: look {len(test.looks)} on {look.tasks} tasks: diff {look.mean:+.3f} "
            f"(se {look.se:.3f}); not worse: {look.not_worse}, improved: {look.improved}"
        )


class ReleaseControl:
    """The gate and the canary, as the learner's loop drives them."""

    def __init__(
        self,
        gate: GateRunner,
        store: Store,
        config: canary.CanaryConfig,
        *,
        actor: str,
        say: Say,
        tag: Callable[[str], AbstractContextManager] = lambda version: nullcontext(),
    ) -> None:
        """`actor`: who the registry's events name for the moves this makes; `tag`: binds
        the version being gated to the process's log lines."""
        self.gate, self.registry, self.store = gate, gate.registry, store
        self.canary, self.actor, self.print, self.tag = config, actor, say, tag
        self.last: str | None = None
        self.on_canary: Callable[[canary.CanaryCheck | None], None] = lambda check: None
        """Hears each canary check (the learner's telemetry publishes it for the dashboard)."""
        self._next_check = 0.0
        self._retry_at = 0.0
        self._errors: dict[str, int] = {}
        """Gates of a version that could not judge it, in this process."""

    def canary_active(self) -> bool:
        return CANDIDATE in self.registry.aliases()

    def pending_canary(self) -> str | None:
        """For `arloop learn --once`: the canary checked now; while its candidate is still out,
        why no round runs and what to run next (None: no canary, or it has just decided)."""
        if not self.canary_active():
            return None
        self._check_canary()
        aliases = self.registry.aliases()
        candidate = aliases.get(CANDIDATE)
        if candidate is None:
            return None
        line = self.last if (self.last or "").startswith("canary ") else None
        where = line or f"canary {candidate} vs {aliases.get(CHAMPION)}"
        return (
            f"{candidate} is the candidate and its canary is still running ({where}): no "
            "round while it runs. Next: `arloop learn` (without --once) lets the canary promote "
            f"or roll back {candidate} from live feedback; or decide now: `arloop policy promote "
            f"{candidate}` or `arloop policy rollback --candidate`"
        )

    def after_round(self, version: str) -> None:
        """Gate the version a round just published."""
        self._gate(version)

    def tick(self) -> None:
        """Check the canary when due; gate a READY version the gate has not judged yet."""
        now = time.monotonic()
        if now < self._next_check:
            return
        self._next_check = now + self.canary.check_s
        if self.canary_active():
            self._check_canary()
            return
        self.on_canary(None)
        if now >= self._retry_at:
            pending = self.pending()
            if pending:
                self._gate(pending)

    def pending(self) -> str | None:
        """The newest READY version without a verdict (or whose gate errored), if any."""
        for record in reversed(self.registry.versions()):
            if record.status is VersionStatus.READY:
                if record.report is None or record.report.get("verdict") == ERROR:
                    return record.version
                return None
        return None

    def _gate(self, version: str) -> None:
        with self.tag(version):  # the gate's lines, its eval runs' too, name it
            self._gate_now(version)

    def _gate_now(self, version: str) -> None:
        self.print(f"gating {version} against the champion ...")
        try:
            report = self.gate.evaluate(version)
        except Exception as exc:  # Redis itself may be what failed: write nothing until it gives up
            log.exception("gate failed")
            reason = f"the gate failed ({type(exc).__name__}: {exc})"
            report = refuse(version, CHAMPION, "gate", reason, suite=self.gate.suite.name)
            if not self._gave_up(report):
                self._say(f"{version}: {reason}; it stays READY and is retried")
            return
        self.print(report.summary())
        if report.verdict == ERROR and self._gave_up(report):
            return
        message = apply_verdict(self.registry, report, canary=self.canary.enabled, actor=self.actor)
        self._say(message)

    def _gave_up(self, report: GateReport) -> bool:
        """Count a gate that could not judge; True once the version is rejected for it, else
        the next try is set (twice as far off as the last)."""
        n = self._errors[report.version] = self._errors.get(report.version, 0) + 1
        attempts = self.gate.config.error_attempts
        if n < attempts:
            wait = min(RETRY_MAX_S, max(self.canary.check_s, RETRY_FIRST_S) * 2 ** (n - 1))
            self._retry_at = time.monotonic() + wait
            return False
        why = f"the gate could not judge it {n} times (last: {report.reason})"
        try:
            reject(self.registry, dataclasses.replace(report, reason=why))
        except Exception as exc:  # another writer moved it first, or Redis is down: tried again
            self._errors[report.version] = attempts - 1
            self._retry_at = time.monotonic() + RETRY_MAX_S
            self._say(f"{report.version}: {why}, and it cannot be rejected: {exc}")
            return True
        self._say(f"{report.version} rejected: {why}; fix the cause and run a new round")
        return True

    def _check_canary(self) -> None:
        try:
            status = canary.check(self.store, self.registry, self.canary)
            self.on_canary(status)
            if status is None:
                return
            if status.action == canary.CONTINUE:
                self.last = status.line()  # shown in the status view, not a log line per check
                return
            self._say(canary.act(self.registry, status, self.actor))
        except (AliasConflict, ReleaseError) as exc:
            self._say(f"canary: {exc}")

    def _say(self, message: str) -> None:
        self.last = message
        self.print(message)
        log.info(message)
