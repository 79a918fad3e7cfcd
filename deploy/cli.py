"""`arloop`: the command line. Each command reads its process's settings from `ARLOOP_*`."""

from __future__ import annotations

import os

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
    rich_markup_mode="rich",
)
serve_app = typer.Typer(help="Run a serving process (agent API or policy server).")
policy_app = typer.Typer(help="Inspect and move policy versions in the registry.")
app.add_typer(serve_app, name="serve")
app.add_typer(policy_app, name="policy")


@serve_app.command("agents")
def serve_agents() -> None:
    """Serve the agent API (ARLOOP_HOST, ARLOOP_PORT, ARLOOP_API_KEYS, ARLOOP_SECRET_KEY,
    ARLOOP_POLICY_API_BASE, ARLOOP_POLICY_MODEL, ARLOOP_REDIS_URL)."""
    from deploy.agent_api import serve

    serve()


@serve_app.command("policy")
def serve_policy() -> None:
    """Serve the policy over an OpenAI-compatible API (ARLOOP_BASE_MODEL, ARLOOP_PORT,
    ARLOOP_REDIS_URL); follows the registry's champion and hot-reloads new versions."""
    from deploy.policy_server import serve

    serve()


@app.command("learn")
def learn(
    once: bool = typer.Option(
        False, "--once", help="Run one round now if anything is trainable, then exit."
    ),
) -> None:
    """Learn from trajectories and feedback in Redis and publish new policy versions
    (ARLOOP_BASE_MODEL, ARLOOP_MIN_EPISODES, ARLOOP_ROUND_INTERVAL_S, ARLOOP_FEEDBACK_WINDOW_S,
    ARLOOP_SILENCE_REWARD, ARLOOP_FULL_FINETUNE, ARLOOP_LEARNING_RATE, ARLOOP_DATA_DIR,
    ARLOOP_REDIS_URL; all in deploy/settings.py LearnerSettings). Stops cleanly on Ctrl-C."""
    from deploy.learner_runner import main

    raise typer.Exit(main(once=once))
