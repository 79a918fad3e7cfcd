"""`arloop`: the command line. Each command reads its process's settings from `ARLOOP_*`."""

from __future__ import annotations

import os
from pathlib import Path

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
os.environ.setdefault("TLDEXTRACT_PUBLIC_SUFFIX_LIST_URLS", "")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import typer

from deploy.cli_errors import (
    HOST_HELP,
    PORT_HELP,
    error_boundary,
    listen_on,
    show_version,
)
from deploy.demo.command import demo

app = typer.Typer(
    help="arloop: deploy LLM agents and keep making them better from what their users say.\n\n"
    "Configuration comes from ARLOOP_* environment variables (and a .env file); every "
    "command's --help lists the ones it reads.",
    no_args_is_help=True,
    rich_markup_mode="markdown",  # docstrings wrap as paragraphs
)
serve_app = typer.Typer(
    help="Run a serving process (agent API, policy server, or the vLLM sync).",
    rich_markup_mode="markdown",
)
policy_app = typer.Typer(
    help="Inspect and move policy versions in the registry.", rich_markup_mode="markdown"
)
app.add_typer(serve_app, name="serve")
app.add_typer(policy_app, name="policy")
packs_app = typer.Typer(
    help="The agent packs this install can serve (bring your own: README, Packs).",
    rich_markup_mode="markdown",
)
app.add_typer(packs_app, name="packs")


@app.callback()
def _main(
    _version: bool = typer.Option(
        False, "--version", callback=show_version, is_eager=True, help="Print the version and exit."
    ),
) -> None:
    """arloop: deploy LLM agents and keep making them better from what their users say."""


class Refused(Exception):
    """A process refused to start; the message says why and what to do."""


@serve_app.command("agents")
def serve_agents(
    host: str = typer.Option(None, "--host", help=HOST_HELP.format("AGENTS")),
    port: int = typer.Option(
        None, "--port", min=0, max=65535, help=PORT_HELP.format("AGENTS", 8000)
    ),
) -> None:
    """Serve the agent API (ARLOOP_AGENTS_HOST, ARLOOP_AGENTS_PORT, ARLOOP_API_KEYS,
    ARLOOP_SECRET_KEY, ARLOOP_PACKS, ARLOOP_POLICY_API_BASE, ARLOOP_POLICY_MODEL,
    ARLOOP_POLICY_PROVIDER, ARLOOP_POLICY_FALLBACKS, ARLOOP_AGENT_MODELS, ARLOOP_CANARY_SHARE,
    ARLOOP_REDIS_URL; all in deploy/settings.py AgentApiSettings)."""
    from agents.model_routes import ModelRouteError
    from agents.packs import PackNotFound

    def run() -> None:
        from deploy.agent_api.app import serve

        serve()

    listen_on("AGENTS", host, port)
    error_boundary("serve agents", run, "agents", PackNotFound, ModelRouteError)


@serve_app.command("policy")
def serve_policy(
    host: str = typer.Option(None, "--host", help=HOST_HELP.format("POLICY")),
    port: int = typer.Option(
        None, "--port", min=0, max=65535, help=PORT_HELP.format("POLICY", 8001)
    ),
) -> None:
    """Serve the policy over an OpenAI-compatible API (ARLOOP_BASE_MODEL, ARLOOP_MODEL_CACHE,
    ARLOOP_POLICY_HOST, ARLOOP_POLICY_PORT, ARLOOP_TOOL_FORMAT, ARLOOP_POLICY_ENGINE (llamacpp
    where installed, else transformers), ARLOOP_LLAMACPP_QUANT, ARLOOP_LLAMACPP_THREADS,
    ARLOOP_REDIS_URL; all in deploy/policy_server/settings.py PolicyServerSettings); follows the registry's
    champion and hot-reloads new versions. Needs `arloop[learn]` (torch)."""
    from learner.policy.registry import BaseModelMismatch

    def run() -> None:
        from deploy.policy_server.app import serve
        from deploy.policy_server.engines import EngineUnavailable
        from learner.policy.models import ModelNotFound  # torch: inside the boundary

        try:
            serve()
        except (EngineUnavailable, ModelNotFound) as exc:
            raise Refused(str(exc)) from None

    listen_on("POLICY", host, port)
    error_boundary("serve policy", run, "policy", Refused, BaseModelMismatch)


@serve_app.command("vllm-sync")
def serve_vllm_sync(
    check: bool = typer.Option(
        False,
        "--check",
        help="Compare what vLLM serves with the registry, print it, exit 1 on a gap.",
    ),
    once: bool = typer.Option(False, "--once", help="One pass, then exit."),
) -> None:
    """Keep a running `vllm serve --enable-lora` (VLLM_ALLOW_RUNTIME_LORA_UPDATING=True) serving
    the registry's champion and candidate: each published LoRA version is loaded under a new
    adapter name, versions no alias uses are unloaded after a drain grace, and the routes the
    agents call (ARLOOP_POLICY_MODEL=hosted_vllm/<ARLOOP_VLLM_ROUTE_NAME>) are written to Redis
    with the digest vLLM serves (ARLOOP_VLLM_URL, ARLOOP_VLLM_ROUTE_NAME, ARLOOP_VLLM_BASE_NAME,
    ARLOOP_VLLM_PATH_MAP, ARLOOP_VLLM_DRAIN_S, ARLOOP_REDIS_URL; all in
    deploy/vllm_sync/settings.py)."""
    from deploy.vllm_sync.app import check_command, serve

    if check:
        error_boundary("serve vllm-sync --check", check_command, "vllm-sync")
    else:
        error_boundary("serve vllm-sync", lambda: serve(once=once), "vllm-sync")


@app.command("learn")
def learn(
    once: bool = typer.Option(
        False, "--once", help="Run one round now if anything is trainable, then exit."
    ),
) -> None:
    """Learn from trajectories and feedback in Redis and publish new policy versions
    (ARLOOP_BASE_MODEL, ARLOOP_MIN_EPISODES, ARLOOP_ROUND_INTERVAL_S,
    ARLOOP_ROUND__FEEDBACK_WINDOW_S, ARLOOP_ROUND__SILENCE_REWARD, ARLOOP_TRAIN__LEARNING_RATE,
    ARLOOP_TRAIN__FULL_FINETUNE, ARLOOP_EVAL_GATE (on by default: every installed pack with
    an eval suite gates each version; false: straight to champion), ARLOOP_EVAL_PACKS,
    ARLOOP_GUARDS__*, ARLOOP_CANARY__*, ARLOOP_REPORT_TO, ARLOOP_DATA_DIR, ARLOOP_REDIS_URL;
    all in deploy/learn/settings.py LearnerSettings, the nested ones in the config models it
    names). Stops cleanly on Ctrl-C.

    On several GPUs (or CPU processes), under accelerate (torchrun works too):
    `accelerate launch --multi_gpu --num_processes 2 -m deploy.cli learn`. Rank 0 reads
    Redis, keeps the ledger and publishes; every rank trains a shard of each batch (DDP).
    ARLOOP_COLLECTIVE_TIMEOUT_S bounds how long a rank waits for a silent peer."""

    def run() -> int:
        from deploy.learn.runner import main

        return main(once=once)

    raise typer.Exit(error_boundary("learn", run, "learner"))


def _release(command: str, **kwargs: object) -> int:
    """`arloop policy ...` and `arloop eval` (deploy/commands.py), through `error_boundary`."""

    def run() -> int:
        from deploy.commands import main

        return main(command, **kwargs)

    return error_boundary("eval" if command == "eval" else f"policy {command}", run, "learner")


@policy_app.command("list")
def policy_list(
    events: int = typer.Option(10, "--events", help="How many recent policy events to show."),
) -> None:
    """Versions (status, aliases, gate verdict and why) and the last moves in the registry
    (ARLOOP_REDIS_URL)."""
    raise typer.Exit(_release("list", events=events))


@policy_app.command("promote")
def policy_promote(
    version: str = typer.Argument(..., help="The version to make champion, e.g. v3."),
    force: bool = typer.Option(False, "--force", help="Promote even a version the gate rejected."),
) -> None:
    """Make a version the champion (compare-and-set: refused if another writer moved it first)."""
    raise typer.Exit(_release("promote", version=version, force=force))


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
    raise typer.Exit(_release("rollback", to=to, candidate=candidate))


@packs_app.command("list")
def packs_list(
    refs: list[str] = typer.Argument(
        None, help="Also load these 'module:attr' references (e.g. myteam.faq:pack)."
    ),
) -> None:
    """Each pack registered under the `arloop.packs` entry points, and each 'module:attr' in
    ARLOOP_PACKS or given here: its source, its agents and whether it has an eval suite (held-out
    tasks and a verifier, for the release gate). Exit 1 when one does not load (its error shown)."""
    from deploy.packs_list import main

    raise typer.Exit(main(_served_refs() + list(refs or [])))


def _served_refs() -> list[str]:
    """ARLOOP_PACKS as the agent API reads it; none when the settings do not load."""
    from pydantic import ValidationError
    from pydantic_settings import SettingsError

    from deploy.settings import AgentApiSettings

    try:
        return AgentApiSettings().packs
    except (ValidationError, SettingsError) as exc:
        typer.echo(f"arloop packs list: ARLOOP_PACKS not read ({exc})", err=True)
        return []


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
    """Run the eval gate: the packs' held-out suites (ARLOOP_EVAL_PACKS, by default every
    installed pack with one) through the agents
    against the policy server (ARLOOP_POLICY_API_BASE), plus the guards (ARLOOP_GUARDS__*)
    and the off-policy estimate (ARLOOP_GATE__*). Exit 0 pass, 1 reject, 2 error."""
    raise typer.Exit(
        _release("eval", version=version, against=against, apply=apply, as_json=as_json)
    )


# -- arloop export (issue 17) ------------------------------------------------------------------
@app.command("export")
def export(
    fmt: str = typer.Option(
        ...,
        "--format",
        help="trl-grpo (prompt, completion, reward), sft (the same, runs rewarded above 0), "
        "kto (prompt, completion, label) or dpo (prompt, chosen, rejected).",
    ),
    out: Path = typer.Option(
        ..., "--out", help="The file to write: data.parquet, or data.jsonl (JSON lines)."
    ),
    pack: str = typer.Option(
        None, "--pack", help="Only the runs of this pack's agents (a built-in name or module:attr)."
    ),
    since: str = typer.Option(
        None,
        "--since",
        help="Only runs finished since then: 7d, 12h, 30m ago, an ISO date or time, or epoch s.",
    ),
    scrub: bool = typer.Option(
        False,
        "--scrub",
        help="Scrub PHI from the rows now, instead of refusing rows that still hold some "
        "(runs logged with ARLOOP_SCRUB_PHI=false).",
    ),
) -> None:
    """Write the runs the learner has read (ARLOOP_DATA_DIR's learner store) and their feedback
    as a Hugging Face `datasets` dataset in TRL's column conventions, conversational, with the
    learner's own rewards (its caps: ARLOOP_ROUND__MAX_USER_REWARD_SHARE). Every text is
    checked for PHI first. Exit 0 written, 1 refused or nothing to export, 2 cannot run."""

    def run() -> int:
        from deploy.export import ExportOptions, main

        return main(ExportOptions(fmt, out, pack, since, scrub))

    raise typer.Exit(error_boundary("export", run, "learner"))


# -- end arloop export ---------------------------------------------------------------------------


@app.command("forget")
def forget(
    user: str = typer.Option(..., "--user", help="The user id, as your app sends it."),
    tenant: str = typer.Option(
        "default", "--tenant", help="The tenant of the API key the user came with."
    ),
) -> None:
    """Erase one user's data (their threads, long-term memories, and logged runs and feedback)
    from Redis with the agent API's settings (ARLOOP_REDIS_URL, ARLOOP_USER_ID_KEY or
    ARLOOP_SECRET_KEY); the learner then erases its own copy. Weights already trained on the
    data are not retrained. The agent API's `DELETE /v1/users/{user_id}` does the same."""

    def run() -> int:
        from deploy.forget import main

        return main(user, tenant)

    raise typer.Exit(error_boundary("forget", run, "agents"))


@app.command("stress")
def stress(
    agent: str = typer.Option(None, "--agent", help="Only this agent (default: every served one)."),
) -> None:
    """Run the report card's stress cases (empty, very long and contradictory input; an
    instruction planted in every tool output) through the served agents (ARLOOP_PACKS) against
    the policy endpoint (ARLOOP_POLICY_API_BASE, ARLOOP_POLICY_MODEL); the runs go to
    arloop:eval:trajectories (never trained on) and show on the report card."""
    from agents.packs import PackNotFound

    def run() -> int:
        from deploy.stress import main

        return main(agent)

    raise typer.Exit(error_boundary("stress", run, "agents", PackNotFound))


app.command("demo")(demo)


if __name__ == "__main__":  # `accelerate launch ... -m deploy.cli learn`
    app()
