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
the gate take turns), so the policy server and the learner each get both cores by default;
prompts are short (a one-shot example, answers of at most `max_tokens`), and the gate
evaluates each champion once.
"""

from __future__ import annotations

import json
import random
import secrets
import signal
import threading
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import redis
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from agents.packs.base import Pack, Task
from deploy.demo.compare import final_comparison
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

API_KEY = "demo-" + secrets.token_hex(8)


@dataclass(frozen=True)
class DemoOptions:
    """What `arloop demo --help` offers; the defaults take 6-7 minutes on 2 cores."""

    rounds: int = 2
    users: int = 8
    """Simulated users talking to the agent API at once."""
    episodes: int = 32
    """Runs (visits) per round; `group` users bring the same problem."""
    group: int | None = None
    """Users who bring the same problem; None: the pack's (`GROUPS`)."""
    eval_size: int = 480
    """Held-out problems the gate draws from (its looks: up to 48 of them, sampled 6 times, 8 in
    the final check)."""
    model: str = "smollm2"
    pack: str = "tutoring"
    """The pack whose agents the users talk to and the gate judges: `tutoring` (students) or
    `medical` (patients)."""
    seed: int = 0
    """Seeds the users' sampling and feedback noise (and, unless `draw` is set, the problems)."""
    draw: int | None = None
    """Seeds which training problems the students bring; None: `seed` (one knob for both)."""
    report_dir: Path = Path("reports")
    data_dir: Path | None = None
    """Default: a fresh `.arloop/demo-<time>`."""
    temperature: float = 0.7
    """Sampling temperature of the served policy; the gate samples alike (what users get)."""
    max_tokens: int = 32
    threads: int = 2
    """torch threads of the policy server and of the learner: traffic, training and the gate
    take turns, so each may use both cores while it works."""
    silence: float = 0.1
    noise: float = 0.05
    closing_visit: bool = True
    """After the last round, the learner stops and one more round of students visits the
    final champion: its thumbs-up rate is measured on the same traffic as the others'."""
    learning_rate: float = 2e-4
    kl_coef: float = 0.04
    phase_timeout_s: float = 900.0
    gate_samples: int = 6
    """Samples of each held-out task in a round's gate (`DEMO_GATE`); the final check takes 8."""


DEMO_GATE: dict[str, Any] = {
    # a smaller gate than `arloop learn`'s (looks at 40/80/120 tasks, 8 samples a task, 40
    # whole runs, 24 guard runs), sized for the demo's minutes: 6 samples a task, a quarter
    # fewer runs than 8, where a truly equal candidate still passes about 66 % of the time
    # (77 % with 8) and a true 10-point regression 0.1 % (tests/learner/gate/test_sequential.py
    # simulates them; in six demo runs the first 6 of 8 samples gave all 12 gates the release
    # decision the 8 gave). Each gate stops once "not worse" is settled (the release decision
    # is the same); "improved" is settled by the final check, v2 against v0 on v0's draw.
    "looks": [24, 48],
    "full_tasks": 8,
    "guard_tasks": 8,
    "stop_when_released": True,
    "ope_max_runs": 64,
}
"""The learner's gate settings (`ARLOOP_GATE__*`) in the demo, with `DemoOptions.gate_samples`;
its final check uses them too."""
FINAL_CHECK = DEMO_GATE | {"stop_when_released": False, "full_tasks": 16, "samples": 8}
"""The final check runs on until "improved" is settled, 8 samples a task (a true 20-point gain
shows "improved" at its first look 87 % of the time; v0's first 6 come from round 1's gate),
and 16 whole runs give the users' view."""


GROUPS = {"tutoring": 4, "medical": 1}
"""Users per problem by pack: students in fours (the learner's prompt groups); every patient
with a case of their own, so the clinic's dispositions label distinct messages (the level
head learns from distinct cases: 8 cases labelled 4 times teach it what 8 labels do)."""


def group_of(opts: DemoOptions) -> int:
    return opts.group or GROUPS.get(opts.pack, 4)


def quick(opts: DemoOptions) -> DemoOptions:
    """The tiny model, one round, a handful of runs: the whole path in well under a minute."""
    return replace(
        opts,
        model="tiny",
        rounds=1,
        users=4,
        episodes=8,
        group=2,
        eval_size=12,
        max_tokens=12,
        # two versions of the random tiny model solve alike: on its 12 held-out tasks, 8
        # samples a task show "not worse", so the path through a release runs (6 do not)
        gate_samples=8,
    )


def _quiet(opts: DemoOptions) -> int:
    return round(opts.silence * opts.episodes)


def _batch(opts: DemoOptions) -> int:
    """Rows the policy server decodes together, and the gate's runs in flight: two tasks' 8
    samples at once (measured: a gate 96 s at 8, 71 s at 16, `bench/bench_gate.py`)."""
    return max(16, opts.users)


def stack_env(
    opts: DemoOptions, policy_url: str, pack: Pack | None = None
) -> dict[str, dict[str, str]]:
    """The `ARLOOP_*` settings of each process (`pack`: the demo's, whose agents may ask for
    more tokens than `max_tokens`: the triage agent writes up to 80)."""
    threads = str(opts.threads)
    trainable = str(opts.episodes - _quiet(opts))
    # how the agents sample and write tools: the learner's sub-rounds resample alike
    sampling = {
        "ARLOOP_TOOL_FORMAT": "line",  # what the pack's worked example is sized for
        "ARLOOP_POLICY_TEMPERATURE": str(opts.temperature),
        "ARLOOP_POLICY_MAX_TOKENS": str(opts.max_tokens),
    }
    return {
        "policy": {
            "ARLOOP_BASE_MODEL": opts.model,
            "ARLOOP_THREADS": threads,
            "ARLOOP_MAX_BATCH_SIZE": str(_batch(opts)),
            # a ReAct call stays under 600 tokens: 1024 keeps each slot's KV (reserved up front
            # by llama.cpp) and its copies small; a Reflexion retry carries its first attempt,
            # the check's critique and a reflection (the triage agent's reached 1,002 tokens)
            "ARLOOP_CONTEXT_LENGTH": str(context_length(pack)),
            "ARLOOP_BATCH_WINDOW_MS": "20",
            "ARLOOP_MAX_TOKENS_CAP": str(token_cap(opts, pack)),
            "ARLOOP_RELOAD_POLL_S": "1",
            "ARLOOP_TOOL_FORMAT": sampling["ARLOOP_TOOL_FORMAT"],
            # llama.cpp's threads spin: the demo's phases take turns, so both cores are free
            # while it decodes (traffic, the gate) and it is idle while the learner trains
            "ARLOOP_LLAMACPP_THREADS": threads,
        },
        "agents": {
            "ARLOOP_PACKS": f'["{opts.pack}"]',
            "ARLOOP_POLICY_API_BASE": policy_url,
            **{k: v for k, v in sampling.items() if k != "ARLOOP_TOOL_FORMAT"},
            "ARLOOP_CANARY_SHARE": "0",
            "ARLOOP_API_KEYS": f'["{API_KEY}"]',
            "ARLOOP_SECRET_KEY": secrets.token_hex(32),
            "ARLOOP_RUN_RATE_PER_MINUTE": "100000",
            "ARLOOP_FEEDBACK_RATE_PER_MINUTE": "100000",
            "OMP_NUM_THREADS": "1",
        },
        "learn": {
            "ARLOOP_BASE_MODEL": opts.model,
            **sampling,
            "OMP_NUM_THREADS": threads,
            "ARLOOP_MIN_EPISODES": trainable,
            "ARLOOP_ROUND__MAX_EPISODES": trainable,
            "ARLOOP_ROUND_INTERVAL_S": "1e9",
            "ARLOOP_ROUND__FEEDBACK_WINDOW_S": "30",
            "ARLOOP_TRIM_INTERVAL_S": "1e9",  # the report reads every event back
            "ARLOOP_READ_BLOCK_MS": "300",
            "ARLOOP_TRAIN__LEARNING_RATE": str(opts.learning_rate),
            "ARLOOP_TRAIN__KL_COEF": str(opts.kl_coef),
            "ARLOOP_TRAIN__MICRO_BATCH_SIZE": "8",
            "ARLOOP_EVAL_PACKS": f'["{opts.pack}"]',
            "ARLOOP_TUTORING_EVAL_SIZE": str(opts.eval_size),
            "ARLOOP_POLICY_API_BASE": policy_url,
            "ARLOOP_EVAL_MAX_TOKENS": str(opts.max_tokens),
            "ARLOOP_EVAL_CONCURRENCY": str(_batch(opts)),
            "ARLOOP_CANARY__ENABLED": "false",
            **{f"ARLOOP_GATE__{k.upper()}": json.dumps(v) for k, v in DEMO_GATE.items()},
            "ARLOOP_GATE__SAMPLES": str(opts.gate_samples),
            "ARLOOP_ROUND__TRAIN_AFTER_TOOL": "false",  # the tutor's answer turn copies the calculator
        },
    }


def fresh_dir(opts: DemoOptions) -> Path:
    folder = opts.data_dir or Path(".arloop") / f"demo-{time.strftime('%Y%m%d-%H%M%S')}"
    if folder.exists() and any(folder.iterdir()):
        raise ValueError(f"data directory {folder} is not empty: the demo needs a fresh one")
    folder.mkdir(parents=True, exist_ok=True)
    return folder.resolve()


def context_length(pack: Pack | None) -> int:
    """The policy server's context for the demo: 1024, 2048 when an agent of the pack retries
    (Reflexion: the retry's prompt holds the attempt it retries)."""
    agents = pack.agents if pack else ()
    return 2048 if any(a.kind == "reflexion" and a.max_attempts > 1 for a in agents) else 1024


def token_cap(opts: DemoOptions, pack: Pack | None) -> int:
    """The most completion tokens the policy server grants a choice: the demo's `max_tokens`,
    or more where one of the pack's agents sets its own (else its requests are refused)."""
    agents = pack.agents if pack else ()
    return max([opts.max_tokens, *(a.generation.max_tokens or 0 for a in agents if a.generation)])


def run_demo(opts: DemoOptions, console: Console) -> tuple[Report, Path]:
    """The demo; (report, report folder). StackError when a process fails (logs named)."""
    from agents.packs import get_pack

    started = time.monotonic()
    data_dir = fresh_dir(opts)
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
            f"{opts.model}, {opts.rounds} rounds of {opts.episodes} runs"
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
            GateConfig(**FINAL_CHECK),
            temperature=opts.temperature,
            max_tokens=opts.max_tokens,
            concurrency=_batch(opts),
            console=console,
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
        quiet=_quiet(opts),
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
