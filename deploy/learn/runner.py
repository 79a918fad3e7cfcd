"""`arloop learn`: the learner process. Reads the streams, runs rounds, publishes versions.

The process: settings, start checks, Redis, then `deploy.learn.loop.Learner`'s loop, with
every error it can name printed as a message with its fix and an exit code.

A round starts when `min_episodes` trainable episodes wait, or when `round_interval_s` has
passed since the last one and any episode waits; `--once` runs one round now (if anything is
trainable) and exits. SIGTERM / Ctrl-C stop between steps: a round not yet committed is
abandoned (its episodes stay trainable), so stopping never loses or doubles anything.
"""

from __future__ import annotations

import signal

from rich.console import Console
from rich.markup import escape

from deploy.embedded_redis import RedisUnavailable, StartGuard
from deploy.learn.loop import Learner
from deploy.learn.metrics import serve_metrics
from deploy.learn.plan import LearnerConfigError
from deploy.learn.ranks import LAUNCH_LINE, PeerLost, follow, join, launch_rank
from deploy.learn.settings import LearnerSettings
from deploy.learn.trackers import TrackerUnavailable


def main(once: bool = False) -> int:
    """Entry point of `arloop learn`: settings from ARLOOP_*, errors as messages, exit code."""
    from pydantic import ValidationError
    from pydantic_settings import SettingsError

    from deploy.logs import setup_logging
    from deploy.redis_conn import RedisUnreachable, wait_for
    from deploy.settings_errors import explain
    from deploy.start_checks import StartRefused, refuse
    from deploy.telemetry import setup_tracing
    from learner.policy.models import ModelNotFound, check_base
    from learner.policy.registry import BaseModelMismatch

    console = Console(soft_wrap=True)  # one line per round, also in a log file
    guard = StartGuard()  # a refused start stops the embedded Redis it started
    try:
        settings = LearnerSettings()
        setup_logging("learner", settings.log_level, settings.log_format)
        rank, world = launch_rank()
        if world > 1:  # `accelerate launch` / torchrun: rank 0 learns, the others train with it
            join(settings.collective_timeout_s)
            if rank > 0:
                return follow(rank, settings.collective_timeout_s, console.print)
            console.print(f"rank 0 of {world}: learning, with {world - 1} more training ranks")
            # the launcher SIGTERMs every rank once one dies: rank 0 stops between steps
            # (Learner.run's handler) and, outside it, still finishes saying why it stopped
            signal.signal(signal.SIGTERM, lambda signum, frame: None)
        setup_tracing("learner", settings.otlp_endpoint)  # the gate's eval runs
        # every problem at once, before Redis is started or the registry records a v0 of a
        # name that does not load
        refuse(
            lambda: check_base(settings.base_model, cache_dir=settings.model_cache),
            lambda: _eval_packs_load(settings),
            errors=(ModelNotFound, LearnerConfigError),
        )
        if settings.redis_url:  # (the embedded one is started and answers, or says why not)
            until = "the learner starts when it answers (Ctrl-C to stop)"
            wait_for(settings.redis_url, settings, console.print, until=until, wait=not once)
        guard.ensure(settings.redis_url, settings.data_dir)  # the Learner finds it up
        try:
            learner = Learner(settings, console, world=world)
        except BaseException:
            guard.abandon()
            raise
        if settings.metrics_port and not once:
            _serve_metrics(learner, settings, console)
        return learner.run(once=once)
    except (ValidationError, SettingsError) as exc:
        for line in explain(exc, LearnerSettings):
            console.print(f"[red]arloop learn:[/] {escape(line)}")
    except (
        RedisUnavailable,
        ModelNotFound,
        LearnerConfigError,
        BaseModelMismatch,
        TrackerUnavailable,
        RedisUnreachable,
    ) as exc:
        console.print(f"[red]arloop learn:[/] {escape(str(exc))}")
    except StartRefused as exc:
        for line in exc.problems:
            console.print(f"[red]arloop learn:[/] {escape(line)}")
    except KeyboardInterrupt:  # Ctrl-C while waiting for Redis
        console.print("learner stopped while waiting for Redis")
        return 0
    except PeerLost as exc:
        console.print(f"[red]arloop learn: stopped[/]: {escape(str(exc))}; relaunch: {LAUNCH_LINE}")
        return 3
    guard.abandon()
    return 2


def _eval_packs_load(s: LearnerSettings) -> None:
    """LearnerConfigError naming ARLOOP_EVAL_PACKS when a gating pack does not load."""
    from agents.packs import PackNotFound, get_pack

    size, source = s.tutoring_eval_size, s.tutoring_source
    try:
        for ref in s.gate_packs():
            get_pack(ref, tutoring_source=source, tutoring_eval_size=size)
    except PackNotFound as exc:
        raise LearnerConfigError(f"{exc}; fix ARLOOP_EVAL_PACKS") from exc


def _serve_metrics(learner: Learner, settings: LearnerSettings, console: Console) -> None:
    where = f"{settings.metrics_host}:{settings.metrics_port}"
    try:
        serve_metrics(learner.telemetry, settings.metrics_host, settings.metrics_port)
    except OSError as exc:
        console.print(
            f"[yellow]learner /metrics not served: {where}: {exc}; set ARLOOP_METRICS_PORT "
            "(0: none)[/]"
        )
        return
    console.print(f"metrics on http://{where}/metrics")


if __name__ == "__main__":
    import sys

    raise SystemExit(main(once="--once" in sys.argv[1:]))
