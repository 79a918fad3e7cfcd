"""`arloop demo`'s options and help (registered on the CLI by `deploy.cli`); what it runs is
`deploy.demo.run`, with `deploy.demo.options.DemoOptions`."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import typer

from learner.config import RoundConfig

_LEARN_ROUND = RoundConfig()  # `arloop learn`'s round defaults, named in `--help`


def demo(
    rounds: int = typer.Option(
        2, "--rounds", min=1, help="Learning rounds (traffic, training, gate)."
    ),
    users: int = typer.Option(
        8, "--users", min=1, help="Simulated students talking to the agent API at once."
    ),
    episodes: int = typer.Option(
        32,
        "--episodes",
        min=2,
        help="Runs per round (students bring each problem in groups of --group).",
    ),
    group: int = typer.Option(
        None,
        "--group",
        min=1,
        help="Users per problem (a GRPO group); default 4 for tutoring, 1 for medical (each "
        "patient their own case).",
    ),
    eval_size: int = typer.Option(
        480,
        "--eval-size",
        min=1,
        help="Held-out problems the gate draws from (it runs up to 120 of them, in looks).",
    ),
    model: str = typer.Option(
        "smollm2",
        "--model",
        help="Base model: smollm2 (bundled), tiny, or a local Hugging Face folder.",
    ),
    pack: str = typer.Option(
        "tutoring",
        "--pack",
        help="Who visits: tutoring (students and the tutor), medical (patients and the "
        "triage assistant, slower: several model calls an answer), or a team's own agent's "
        "pack as module:attr (e.g. tests.examples.langgraph_tutor.pack:pack, run from the "
        "repository root), served through /v1/chat/completions.",
    ),
    seed: int = typer.Option(0, "--seed", help="Seeds the problems, users and feedback noise."),
    report_dir: Path = typer.Option(
        Path("reports"), "--report-dir", help="Where the report folder goes."
    ),
    data_dir: Path = typer.Option(
        None,
        "--data-dir",
        help="A fresh folder for Redis, the "
        "learner, checkpoints and logs (default .arloop/demo-<time>).",
    ),
    threads: int | None = typer.Option(
        None,
        "--threads",
        min=1,
        help="torch and llama.cpp threads of the policy server and of the learner (default: "
        "the cores idle when the demo starts, at most 2; on a machine busy with other work, "
        "threads beyond its free cores wait on each other).",
    ),
    closing_visit: bool = typer.Option(
        True,
        "--closing-visit/--no-closing-visit",
        help="After "
        "the last round, stop the learner and let the students "
        "visit the final champion once more (its thumbs-up "
        "rate).",
    ),
    phase_timeout: float = typer.Option(
        900.0,
        "--phase-timeout",
        min=60.0,
        help="Seconds each phase (start, a round's visits, training and its gate) may take "
        "before the demo gives up; raise it on a busy machine or for --pack medical.",
    ),
    subrounds: int = typer.Option(
        2,
        "--subrounds",
        min=0,
        help="The learner's verified sub-rounds a round (labelled prompts resampled, checked, "
        f"learned from); `arloop learn` runs {_LEARN_ROUND.subrounds}, the demo 2 to end "
        "within 7 minutes.",
    ),
    resample_n: int = typer.Option(
        4,
        "--resample-n",
        min=2,
        help=f"Runs of each labelled prompt a sub-round; `arloop learn` runs "
        f"{_LEARN_ROUND.resample_n}, the demo 4.",
    ),
    hint_n: int = typer.Option(
        _LEARN_ROUND.hint_n,
        "--hint-n",
        min=0,
        help="Hinted runs (the label stated in the prompt) of a labelled prompt that no run "
        "solved, a sub-round; kept only where a tool's output gave the answer. 0 (the "
        "default): no hints; SmolLM2 mostly copies the hint.",
    ),
    final_draw: Literal["unseen", "gates"] = typer.Option(
        "gates",
        "--final-draw",
        help="Held-out tasks of the final check (the champion against v0): gates, the gates' "
        "own tasks, their runs from the cache; unseen, tasks no gate ran, so the gates' choice "
        "of what to release cannot favour it (30-50 s more: both versions run them afresh).",
    ),
    tiny: bool = typer.Option(
        False,
        "--quick",
        "--tiny",
        help="The tiny model, one round, a few runs: checks the whole path in well under a minute.",
    ),
) -> None:
    """The whole loop on this machine: starts Redis, the policy server, the agent API and the
    learner, runs rounds of simulated students -> feedback -> learning -> eval gate -> publish,
    and ends with a table per version and a report (JSON, Markdown, plots) under --report-dir."""
    from deploy.demo.options import DemoOptions
    from deploy.demo.run import main

    opts = DemoOptions(
        rounds=rounds,
        users=users,
        episodes=episodes,
        group=group,
        eval_size=eval_size,
        model=model,
        pack=pack,
        seed=seed,
        report_dir=report_dir,
        data_dir=data_dir,
        threads=threads,
        closing_visit=closing_visit,
        phase_timeout_s=phase_timeout,
        subrounds=subrounds,
        resample_n=resample_n,
        hint_n=hint_n,
        final_draw=final_draw,
    )
    raise typer.Exit(main(opts, tiny=tiny))
