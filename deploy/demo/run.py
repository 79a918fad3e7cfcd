"""`arloop demo`: the whole loop on this machine, in a fresh data directory, with a report.

Starts Redis, the policy server, the agent API and the learner as real processes, then for
each round: simulated students bring maths problems to the tutoring agent over HTTP and rate
the answers; the learner turns that feedback into a LoRA update, publishes a READY version,
and its eval gate compares it with the champion on held-out problems (pass: champion, and the
policy server reloads it). After the last round the learner stops and the students visit the
final champion once more (a closing visit: its thumbs-up rate, nothing learned from it). The
end: a table per version and `reports/demo-<time>/` with JSON, Markdown and plots.
Everything stops cleanly at the end, on an error, or on Ctrl-C.

CPU: the three processes share the machine but are rarely busy at once (traffic, training and
the gate take turns), so the policy server and the learner each get every core that is idle
when the demo starts (both on an idle 2-core machine; `options.free_threads`);
prompts are short (a one-shot example, answers of at most `max_tokens`), and the gate
evaluates each champion once.
"""

from __future__ import annotations

import json
import random
import signal
import threading
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import redis
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from agents.packs.base import Pack, Task
from deploy.demo.compare import final_comparison
from deploy.demo.options import (
    API_KEY,
    FINAL_CHECK,
    DemoOptions,
    batch_size,
    group_of,
    quick,
    quiet_runs,
    stack_env,
    with_threads,
)
from deploy.demo.report import (
    COLUMNS,
    NARROW_COLUMNS,
    Report,
    build_report,
    headline,
    markdown,
    narrow_cells,
    quick_note,
    table_cells,
)
from deploy.demo.stack import Stack, StackError
from deploy.demo.users import PATIENTS, Behaviour
from deploy.demo.visits import (
    VisitRecord,
    timed,
    traffic,
    visit_tasks,
    wait_for_serving,
    wait_for_verdict,
)
from learner.gate.eval_gate import GateConfig
from learner.policy.registry import BASE_VERSION, PolicyRegistry, version_number


def fresh_dir(opts: DemoOptions) -> Path:
    folder = opts.data_dir or Path(".arloop") / f"demo-{time.strftime('%Y%m%d-%H%M%S')}"
    if folder.exists() and any(folder.iterdir()):
        raise ValueError(f"data directory {folder} is not empty: the demo needs a fresh one")
    folder.mkdir(parents=True, exist_ok=True)
    return folder.resolve()


def run_demo(opts: DemoOptions, console: Console) -> tuple[Report, Path]:
    """The demo; (report, report folder). StackError when a process fails (logs named)."""
    from agents.packs import get_pack

    started = time.monotonic()
    data_dir = fresh_dir(opts)  # a used folder is refused before the second of measuring
    chosen = opts.threads is None
    opts = with_threads(opts)  # before anything of ours runs: the cores idle now
    pack = get_pack(opts.pack, tutoring_eval_size=opts.eval_size)
    stack = Stack(data_dir, {})
    stack.env = stack_env(opts, stack.policy_url, pack)
    seconds: dict[str, float] = {}
    records: list[VisitRecord] = []
    try:
        client = redis.Redis.from_url(stack.start_redis())
        registry = PolicyRegistry(client)
        registry.ensure_base(opts.model)  # before the processes: they would race to create v0
        console.print(
            f"[bold]arloop demo[/] in {data_dir} (logs in {stack.logs}); model "
            f"{opts.model}, {opts.rounds} rounds of {opts.episodes} runs, {opts.threads} "
            f"thread(s) a process{' (the cores idle at start; --threads sets it)' if chosen else ''}"
        )
        stack.start()
        timed(seconds, "start", stack.wait_ready, opts.phase_timeout_s)
        for r in range(1, opts.rounds + 1):
            records.append(_round(r, opts, stack, registry, pack, seconds, console))
        stack.stop_process("learn")  # idle between rounds: stopping it here loses nothing
        if opts.closing_visit:  # students on the final champion, nothing learned from them
            records.append(
                _students(opts.rounds + 1, opts, stack, registry, pack, console, "closing visit")
            )
            seconds["closing visit"] = records[-1].seconds["traffic"]
        improvement = timed(
            seconds,
            "final check",
            final_comparison,
            stack,
            registry,
            pack,
            GateConfig(**FINAL_CHECK, samples=opts.gate_samples),
            temperature=opts.temperature,
            max_tokens=opts.max_tokens,
            concurrency=batch_size(opts),
            console=console,
            draw=opts.final_draw,
        )
        report = build_report(client, pack, improvement)
    finally:
        with console.status("stopping the stack ..."):
            stack.stop()
    seconds["total"] = time.monotonic() - started
    report.options = _jsonable(asdict(opts) | {"data_dir": str(data_dir)})
    report.seconds = {k: round(v, 1) for k, v in seconds.items()}
    report.rounds = [_round_summary(rec) for rec in records]
    folder = opts.report_dir / f"demo-{time.strftime('%Y%m%d-%H%M%S')}"
    write_report(report, folder)
    return report, folder


def _round(
    r: int,
    opts: DemoOptions,
    stack: Stack,
    registry: PolicyRegistry,
    pack: Pack,
    seconds: dict[str, float],
    console: Console,
) -> VisitRecord:
    """Traffic, then the learner's round and gate; the next round starts on the new champion."""
    before = max(version_number(v.version) or 0 for v in registry.versions())
    rec = _students(r, opts, stack, registry, pack, console, f"round {r}")
    version, report = timed(
        rec.seconds,
        "learn+gate",
        wait_for_verdict,
        stack,
        registry,
        before,
        opts.phase_timeout_s,
        console,
        f"round {r}",
    )
    rec.version, rec.verdict, rec.reason = version, report["verdict"], report.get("reason", "")
    console.print(f"round {r}: {version} {rec.verdict.upper()}: {rec.reason}")
    if rec.verdict == "pass":
        timed(rec.seconds, "reload", wait_for_serving, stack, version, 120.0, console)
    for k, v in rec.seconds.items():
        seconds[k] = seconds.get(k, 0.0) + v
    return rec


def _behaviour(pack: Pack, opts: DemoOptions) -> Behaviour:
    """Students judge every answer themselves; patients as a clinic records (`PATIENTS`)."""
    if pack.name == "medical":
        return replace(PATIENTS, delay_s=(0.0, 1.0))
    return Behaviour(noise=opts.noise, delay_s=(0.0, 1.0))


def round_tasks(opts: DemoOptions, pack: Pack, r: int) -> list[Task]:
    """The problems round `r`'s users bring, `group_of(opts)` users to each."""
    rng = random.Random(f"{opts.seed if opts.draw is None else opts.draw}/{r}")
    group = group_of(opts)
    return visit_tasks(pack.tasks("train"), opts.episodes // group, group, rng)


def _students(
    r: int,
    opts: DemoOptions,
    stack: Stack,
    registry: PolicyRegistry,
    pack: Pack,
    console: Console,
    label: str,
) -> VisitRecord:
    """Round `r`'s simulated students on the current champion."""
    champion = registry.resolve("champion")
    tasks = round_tasks(opts, pack, r)
    rec = VisitRecord(r, champion, [])
    rec.visits = timed(
        rec.seconds,
        "traffic",
        traffic,
        stack,
        API_KEY,
        pack,
        tasks,
        _behaviour(pack, opts),
        users=opts.users,
        quiet=quiet_runs(opts),
        seed=opts.seed * 1000 + r,
        console=console,
        label=f"{label}: students on {champion}",
    )
    return rec


def _round_summary(rec: VisitRecord) -> dict[str, Any]:
    solved = sum(v.verdict.score >= 1.0 for v in rec.visits)
    return {
        "round": rec.round,
        "served_by": rec.served_by,
        "runs": len(rec.visits),
        "solved": solved,
        "version": rec.version,
        "verdict": rec.verdict,
        "seconds": {k: round(v, 1) for k, v in rec.seconds.items()},
    }


def _jsonable(d: dict[str, Any]) -> dict[str, Any]:
    return {k: str(v) if isinstance(v, Path) else v for k, v in d.items()}


WIDE_TABLE = 133
"""Columns the full table needs; a narrower terminal gets the short one (80 columns hold it)."""


def print_report(report: Report, folder: Path, console: Console) -> None:
    """The table per version, the headline, where the report is; last, for the tiny model,
    what it does not show."""
    if console.width >= WIDE_TABLE:
        table = Table(title="arloop demo: the policy by version")
        columns, cells = COLUMNS, table_cells
    else:
        table = Table(
            title="arloop demo: the policy by version",
            caption="* the champion",
            box=None,  # no rules between columns: 80 columns hold it
            pad_edge=False,
            header_style="bold underline",
        )
        columns, cells = NARROW_COLUMNS, narrow_cells
    for name in columns:
        table.add_column(name, overflow="fold")
    for row in report.versions:
        table.add_row(*cells(row, report.champion))
    console.print(table)
    console.print(f"[bold]{headline(report)}[/]")
    console.print(
        f"report: {folder}/report.md (json, plots beside it); "
        f"{report.seconds.get('total', 0):.0f} s in all"
    )
    note = quick_note(report)
    if note:
        console.print(f"[yellow]{escape(note)}[/]")


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


def main(opts: DemoOptions, *, tiny: bool = False) -> int:
    """Entry point of `arloop demo`: exit 0 done, 1 a process failed, 130 interrupted."""
    console = Console()
    opts = quick(opts) if tiny else opts
    if threading.current_thread() is threading.main_thread():  # `kill` stops it like Ctrl-C
        signal.signal(signal.SIGTERM, _interrupt)
    try:
        report, folder = run_demo(opts, console)
    except KeyboardInterrupt:
        console.print("[yellow]interrupted: every process was stopped[/]")
        return 130
    except (StackError, ValueError) as exc:
        console.print(f"[red]arloop demo:[/] {exc}")
        return 1
    print_report(report, folder, console)
    return 0


__all__ = ["BASE_VERSION", "DemoOptions", "main", "quick", "run_demo"]


def write_report(report: Report, folder: Path) -> list[Path]:
    """report.json, report.md and the plots into `folder`; the paths written."""
    from deploy.demo.plots import plot_all  # matplotlib: only when writing

    folder.mkdir(parents=True, exist_ok=True)
    (folder / "report.json").write_text(json.dumps(report.to_dict(), indent=2))
    (folder / "report.md").write_text(markdown(report))
    return [folder / "report.json", folder / "report.md", *plot_all(report, folder)]
