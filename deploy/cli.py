"""`arloop`: the command line. Each command reads its process's settings from `ARLOOP_*`."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
os.environ.setdefault("TLDEXTRACT_PUBLIC_SUFFIX_LIST_URLS", "")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import typer

app = typer.Typer(
    help="arloop: deploy LLM agents and keep making them better from what their users say.\n\n"
    "Configuration comes from ARLOOP_* environment variables (and a .env file); every "
    "command's --help lists the ones it reads.",
    no_args_is_help=True,
    rich_markup_mode="markdown",  # docstrings wrap as paragraphs
)
serve_app = typer.Typer(
    help="Run a serving process (agent API or policy server).", rich_markup_mode="markdown"
)
policy_app = typer.Typer(
    help="Inspect and move policy versions in the registry.", rich_markup_mode="markdown"
)
app.add_typer(serve_app, name="serve")
app.add_typer(policy_app, name="policy")


def _serve(command: str, serve: Callable[[], None], *refused: type[Exception]) -> None:
    """Run a server; a bad setting (or a `refused` error) is a message and exit 2, no traceback."""
    from pydantic import ValidationError
    from pydantic_settings import SettingsError

    try:
        serve()
    except (ValidationError, SettingsError, *refused) as exc:
        typer.echo(f"arloop {command}: {exc}", err=True)
        raise typer.Exit(2) from None


@serve_app.command("agents")
def serve_agents() -> None:
    """Serve the agent API (ARLOOP_HOST, ARLOOP_PORT, ARLOOP_API_KEYS, ARLOOP_SECRET_KEY,
    ARLOOP_PACKS, ARLOOP_POLICY_API_BASE, ARLOOP_POLICY_MODEL, ARLOOP_CANARY_SHARE,
    ARLOOP_REDIS_URL; all in deploy/settings.py AgentApiSettings)."""
    from agents.packs import PackNotFound
    from deploy.agent_api.app import serve

    _serve("serve agents", serve, PackNotFound)


@serve_app.command("policy")
def serve_policy() -> None:
    """Serve the policy over an OpenAI-compatible API (ARLOOP_BASE_MODEL, ARLOOP_MODEL_CACHE,
    ARLOOP_PORT, ARLOOP_TOOL_FORMAT, ARLOOP_POLICY_ENGINE (llamacpp where installed, else
    transformers), ARLOOP_LLAMACPP_QUANT, ARLOOP_LLAMACPP_THREADS, ARLOOP_REDIS_URL; all in
    deploy/settings.py PolicyServerSettings); follows the registry's champion and hot-reloads
    new versions."""
    from deploy.policy_server.app import serve
    from deploy.policy_server.engines import EngineUnavailable

    _serve("serve policy", serve, EngineUnavailable)


@app.command("learn")
def learn(
    once: bool = typer.Option(
        False, "--once", help="Run one round now if anything is trainable, then exit."
    ),
) -> None:
    """Learn from trajectories and feedback in Redis and publish new policy versions
    (ARLOOP_BASE_MODEL, ARLOOP_MIN_EPISODES, ARLOOP_ROUND_INTERVAL_S,
    ARLOOP_ROUND__FEEDBACK_WINDOW_S, ARLOOP_ROUND__SILENCE_REWARD, ARLOOP_TRAIN__LEARNING_RATE,
    ARLOOP_TRAIN__FULL_FINETUNE, ARLOOP_EVAL_PACKS, ARLOOP_GUARDS__*, ARLOOP_CANARY__*,
    ARLOOP_DATA_DIR, ARLOOP_REDIS_URL; all in deploy/learn/settings.py LearnerSettings, the
    nested ones in the config models it names). Stops cleanly on Ctrl-C.

    On several GPUs (or CPU processes), under accelerate (torchrun works too):
    `accelerate launch --multi_gpu --num_processes 2 -m deploy.cli learn`. Rank 0 reads
    Redis, keeps the ledger and publishes; every rank trains a shard of each batch (DDP).
    ARLOOP_COLLECTIVE_TIMEOUT_S bounds how long a rank waits for a silent peer."""
    from deploy.learn.runner import main

    raise typer.Exit(main(once=once))


@policy_app.command("list")
def policy_list(
    events: int = typer.Option(10, "--events", help="How many recent policy events to show."),
) -> None:
    """Versions (status, aliases, gate verdict and why) and the last moves in the registry
    (ARLOOP_REDIS_URL)."""
    from deploy.commands import main

    raise typer.Exit(main("list", events=events))


@policy_app.command("promote")
def policy_promote(
    version: str = typer.Argument(..., help="The version to make champion, e.g. v3."),
    force: bool = typer.Option(False, "--force", help="Promote even a version the gate rejected."),
) -> None:
    """Make a version the champion (compare-and-set: refused if another writer moved it first)."""
    from deploy.commands import main

    raise typer.Exit(main("promote", version=version, force=force))


@policy_app.command("rollback")
def policy_rollback(
    to: str = typer.Option(
        None, "--to", help="Version to go back to (default: the previous champion)."
    ),
    candidate: bool = typer.Option(
        False, "--candidate", help="Roll back the canary candidate instead; the champion stays."
    ),
) -> None:
    """Put the champion back to an earlier version (its checkpoint must still exist)."""
    from deploy.commands import main

    raise typer.Exit(main("rollback", to=to, candidate=candidate))


@app.command("eval")
def eval_gate(
    version: str = typer.Argument(None, help="Version to gate (default: the newest)."),
    against: str = typer.Option("champion", "--against", help="Version or alias to compare to."),
    apply: bool = typer.Option(
        False,
        "--apply",
        help="Act on the verdict as the learner does: reject, or open the canary "
        "(promote with ARLOOP_CANARY__ENABLED=false).",
    ),
    as_json: bool = typer.Option(False, "--json", help="Print the report as JSON."),
) -> None:
    """Run the eval gate: the packs' held-out suites (ARLOOP_EVAL_PACKS) through the agents
    against the policy server (ARLOOP_POLICY_API_BASE), plus the guards (ARLOOP_GUARDS__*)
    and the off-policy estimate (ARLOOP_GATE__*). Exit 0 pass, 1 reject, 2 error."""
    from deploy.commands import main

    raise typer.Exit(main("eval", version=version, against=against, apply=apply, as_json=as_json))


@app.command("stress")
def stress(
    agent: str = typer.Option(None, "--agent", help="Only this agent (default: every served one)."),
) -> None:
    """Run the report card's stress cases (empty, very long and contradictory input; an
    instruction planted in every tool output) through the served agents (ARLOOP_PACKS) against
    the policy endpoint (ARLOOP_POLICY_API_BASE, ARLOOP_POLICY_MODEL); the runs go to
    arloop:eval:trajectories (never trained on) and show on the report card."""
    from deploy.stress import main

    raise typer.Exit(main(agent))


@app.command("demo")
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
    group: int = typer.Option(4, "--group", min=1, help="Students per problem (a GRPO group)."),
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
        help="Who visits: tutoring (students and the tutor) or medical (patients and the "
        "triage assistant, slower: several model calls an answer).",
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
    threads: int = typer.Option(
        2, "--threads", min=1, help="torch threads of the policy server and of the learner."
    ),
    closing_visit: bool = typer.Option(
        True,
        "--closing-visit/--no-closing-visit",
        help="After "
        "the last round, stop the learner and let the students "
        "visit the final champion once more (its thumbs-up "
        "rate).",
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
    from deploy.demo.run import DemoOptions, main

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
    )
    raise typer.Exit(main(opts, tiny=tiny))


if __name__ == "__main__":  # `accelerate launch ... -m deploy.cli learn`
    app()
