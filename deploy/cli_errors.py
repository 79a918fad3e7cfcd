"""The `arloop` commands' error boundary (`error_boundary`): a bad setting, a missing extra or
a refused start as one line and exit 2, never a traceback; and what else every command shares:
`--version`, and `--host/--port` over the process's own variables."""

from __future__ import annotations

import os
from collections.abc import Callable

import typer

LEARN_MODULES = frozenset(
    {"torch", "transformers", "safetensors", "peft", "accelerate", "gguf", "matplotlib"}
    | {"datasets", "pyarrow"}
)
"""Top-level modules only the `learn` extra installs (numpy and tokenizers come with `serve`
too, through presidio and litellm): a command that needs one says so."""


def show_version(show: bool) -> None:
    """`--version`: the installed arloop's version, then exit."""
    if show:
        from importlib.metadata import PackageNotFoundError, version

        try:
            typer.echo(f"arloop {version('arloop')}")
        except PackageNotFoundError:  # run from a checkout that was never installed
            typer.echo("arloop (not installed: run from a source checkout)")
        raise typer.Exit()


def error_boundary(
    command: str, run: Callable[[], object], settings: str, *refused: type[Exception]
):
    """Run a command; a bad ARLOOP_* setting (one line per variable), a missing extra or a
    `refused` error is a message and exit 2, never a traceback. `settings`: which class the
    command reads (`agents`, `policy`, `learner`, `vllm-sync`), for the examples of the messages."""
    from pydantic import ValidationError
    from pydantic_settings import SettingsError
    from redis.exceptions import ConnectionError as RedisDown
    from redis.exceptions import TimeoutError as RedisSlow

    from deploy.redis_conn import RedisModeMismatch, RedisUnreachable
    from deploy.start_checks import StartRefused

    try:
        return run()
    except (ValidationError, SettingsError) as exc:
        for line in explain_settings(exc, settings):
            typer.echo(f"arloop {command}: {line}", err=True)
    except ModuleNotFoundError as exc:
        if (exc.name or "").partition(".")[0] not in LEARN_MODULES:
            raise
        typer.echo(
            f"arloop {command} needs the learner's dependencies ({exc.name} is not installed): "
            "pip install 'arloop[learn]'",
            err=True,
        )
    except StartRefused as exc:
        for line in exc.problems:
            typer.echo(f"arloop {command}: {line}", err=True)
    except refused as exc:
        typer.echo(f"arloop {command}: {exc}", err=True)
    except (RedisModeMismatch, RedisUnreachable) as exc:
        typer.echo(f"arloop {command}: {exc}", err=True)
    except (RedisDown, RedisSlow) as exc:  # went away after the start's check
        typer.echo(
            f"arloop {command}: Redis does not answer ({exc}): start it, or fix ARLOOP_REDIS_URL",
            err=True,
        )
    raise typer.Exit(2)


def explain_settings(exc: Exception, settings: str) -> list[str]:
    """The settings error as one line per variable (deploy/settings_errors.py)."""
    from deploy import settings as serving
    from deploy.settings_errors import explain

    if settings == "learner":
        from deploy.learn.settings import LearnerSettings as cls
    elif settings == "vllm-sync":
        from deploy.vllm_sync.settings import VllmSyncSettings as cls
    elif settings == "policy":
        from deploy.policy_server.settings import PolicyServerSettings as cls
    else:
        cls = serving.AgentApiSettings
    return explain(exc, cls)  # type: ignore[arg-type]


def listen_on(process: str, host: str | None, port: int | None) -> None:
    """`--host/--port` win over ARLOOP_<PROCESS>_HOST/_PORT (the settings read those)."""
    if host is not None:
        os.environ[f"ARLOOP_{process}_HOST"] = host
    if port is not None:
        os.environ[f"ARLOOP_{process}_PORT"] = str(port)


HOST_HELP = "Interface to listen on (default: ARLOOP_{0}_HOST, else ARLOOP_HOST, else 127.0.0.1)."
PORT_HELP = "Port to listen on (default: ARLOOP_{0}_PORT, else ARLOOP_PORT, else {1})."
