"""The CLI explains itself: `--version`, one line per bad setting (variable, value, example),
the registry's base model enforced, and a missing extra named instead of a traceback."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from deploy.cli import app
from deploy.cli_errors import LEARN_MODULES
from learner.policy.models import resolve_base
from learner.policy.registry import PolicyRegistry
from tests.learner.gate.release_support import add_version
from tests.model_cache import MODEL_CACHE

ROOT = Path(__file__).resolve().parents[2]
runner = CliRunner()

# A fresh interpreter where the learn extra's modules cannot be imported, as in a
# `pip install arloop[serve]`: a meta-path finder refuses them before any other finder looks.
SERVE_ONLY = """
import importlib.abc, sys
BLOCKED = set(sys.argv[1].split(","))
class Serve(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
sys.meta_path.insert(0, Serve())
"""
CLI = "from deploy.cli import app\napp(sys.argv[2:], prog_name='arloop')\n"


def _serve_only(command: list[str], **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", SERVE_ONLY + CLI, ",".join(sorted(LEARN_MODULES)), *command],
        env=_clean_env(**env),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )


def _clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ARLOOP_")}
    return env | {"COLUMNS": "250", "ARLOOP_MODEL_CACHE": str(MODEL_CACHE)} | extra


def test_version_prints_the_installed_version():
    from importlib.metadata import version

    result = runner.invoke(app, ["--version"])
    assert result.exit_code == 0 and result.output.strip() == f"arloop {version('arloop')}"


@pytest.mark.parametrize(
    ("command", "env", "line"),
    [
        (
            ["serve", "agents"],
            {"ARLOOP_PACKS": "tutoring"},
            "arloop serve agents: ARLOOP_PACKS: 'tutoring' is not a JSON list; "
            """example: ARLOOP_PACKS='["tutoring"]'""",
        ),
        (
            ["serve", "agents"],
            {"ARLOOP_CANARY_SHARE": "2"},
            "arloop serve agents: ARLOOP_CANARY_SHARE: '2' is out of range "
            "(must be >= 0.0 and <= 1.0); example: ARLOOP_CANARY_SHARE=0.1",
        ),
        (
            ["serve", "policy"],
            {"ARLOOP_POLICY_PORT": "http"},
            "arloop serve policy: ARLOOP_POLICY_PORT: 'http' is not a valid integer (unable to "
            "parse string as an integer); example: ARLOOP_POLICY_PORT=8001",
        ),
        (
            ["learn", "--once"],
            {"ARLOOP_EVAL_PACKS": "tutoring"},
            "arloop learn: ARLOOP_EVAL_PACKS: 'tutoring' is not a JSON list; "
            """example: ARLOOP_EVAL_PACKS='["tutoring"]'""",
        ),
        (
            ["policy", "list"],
            {"ARLOOP_LOG_FORMAT": "xml"},
            "invalid setting: ARLOOP_LOG_FORMAT: 'xml' is not one of 'json' or 'text'; "
            "example: ARLOOP_LOG_FORMAT=text",
        ),
        (
            ["learn", "--once"],
            {"ARLOOP_GATE_ALPHA": "0.1"},
            "arloop learn: ARLOOP_GATE_ALPHA is no longer read: set ARLOOP_GATE__ALPHA",
        ),
    ],
)
def test_a_bad_setting_is_one_line_naming_the_variable_value_and_an_example(
    command, env, line, tmp_path
):
    result = subprocess.run(
        [sys.executable, "-c", "from deploy.cli import app; app(prog_name='arloop')", *command],
        env=_clean_env(ARLOOP_DATA_DIR=str(tmp_path), **env),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    out = result.stdout + result.stderr
    assert result.returncode == 2, out
    assert line in out.splitlines(), out
    assert "Traceback" not in out and len(out.strip().splitlines()) == 1, out


def test_the_policy_server_refuses_another_base_model_than_the_registrys_v0(
    redis_url, redis_client, tmp_path
):
    PolicyRegistry(redis_client).ensure_base("tiny")
    other = str(resolve_base("tiny", cache_dir=MODEL_CACHE))  # a base that loads, not v0's
    env = {
        "ARLOOP_REDIS_URL": redis_url,
        "ARLOOP_BASE_MODEL": other,
        "ARLOOP_POLICY_ENGINE": "transformers",
        "ARLOOP_DATA_DIR": str(tmp_path),
    }
    result = runner.invoke(app, ["serve", "policy"], env=env)
    assert result.exit_code == 2, result.output
    assert f"ARLOOP_BASE_MODEL is {other!r} but this registry (its v0) was " in (
        " ".join(result.output.split())
    )
    assert "set ARLOOP_BASE_MODEL=tiny" in result.output
    assert PolicyRegistry(redis_client).get("v0").base_model == "tiny"  # nothing was changed


@pytest.mark.parametrize(
    "command", [["serve", "policy"], ["learn", "--once"], ["eval"], ["policy", "promote", "v1"]]
)
def test_a_serve_only_install_names_the_extra_it_lacks(command, redis_url, redis_client, tmp_path):
    registry = PolicyRegistry(redis_client)
    registry.ensure_base("tiny")
    add_version(registry, tmp_path / "checkpoints")
    result = _serve_only(command, ARLOOP_REDIS_URL=redis_url, ARLOOP_DATA_DIR=str(tmp_path))
    out = result.stdout + result.stderr
    assert result.returncode == 2, out
    assert "needs the learner's dependencies" in out and "pip install 'arloop[learn]'" in out
    assert "Traceback" not in out and "ModuleNotFoundError" not in out, out


def test_a_serve_only_install_lists_policy_versions(redis_url, redis_client, tmp_path):
    registry = PolicyRegistry(redis_client)
    registry.ensure_base("tiny")
    env = {"ARLOOP_REDIS_URL": redis_url, "ARLOOP_DATA_DIR": str(tmp_path)}
    result = _serve_only(["policy", "list"], **env)
    assert result.returncode == 0 and "champion" in result.stdout, result.stdout + result.stderr


def test_the_serve_only_interpreter_really_lacks_torch():
    result = subprocess.run(
        [sys.executable, "-c", SERVE_ONLY + "import torch", "torch"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 1 and "No module named 'torch'" in result.stderr


def test_demo_phase_timeout_reaches_the_demo(monkeypatch):
    """A busy machine or the medical pack needs longer phases than 900 s: --phase-timeout."""
    import deploy.demo.run as demo_run

    seen = {}
    monkeypatch.setattr(demo_run, "main", lambda opts, tiny: seen.setdefault("opts", opts) and 0)
    result = CliRunner().invoke(app, ["demo", "--pack", "medical", "--phase-timeout", "2400"])

    assert result.exit_code == 0, result.output
    assert seen["opts"].phase_timeout_s == 2400.0 and seen["opts"].pack == "medical"
    refused = CliRunner().invoke(app, ["demo", "--phase-timeout", "5"])
    assert refused.exit_code == 2 and "phase-timeout" in refused.output


def test_demo_verified_compute_reaches_the_learner(monkeypatch):
    """`arloop demo` runs fewer verified sub-rounds than `arloop learn` (its 7 minutes);
    --subrounds and --resample-n give the learner's own, and its --help names them."""
    import deploy.demo.run as demo_run
    from deploy.demo.options import stack_env
    from learner.config import RoundConfig

    seen = {}
    monkeypatch.setattr(demo_run, "main", lambda opts, tiny: seen.setdefault("opts", opts) and 0)
    learn = RoundConfig()
    args = ["demo", "--subrounds", str(learn.subrounds), "--resample-n", str(learn.resample_n)]
    result = CliRunner().invoke(app, args)

    assert result.exit_code == 0, result.output
    env = stack_env(seen["opts"], "http://policy")["learn"]
    assert env["ARLOOP_ROUND__SUBROUNDS"] == str(learn.subrounds)
    assert env["ARLOOP_ROUND__RESAMPLE_N"] == str(learn.resample_n)
    seen.clear()
    assert CliRunner().invoke(app, ["demo"]).exit_code == 0
    default = stack_env(seen["opts"], "http://policy")["learn"]
    assert (default["ARLOOP_ROUND__SUBROUNDS"], default["ARLOOP_ROUND__RESAMPLE_N"]) == ("2", "4")
    helped = " ".join(
        CliRunner().invoke(app, ["demo", "--help"], env={"COLUMNS": "250"}).output.split()
    )
    assert f"arloop learn runs {learn.subrounds}, the demo 2" in helped, helped
    refused = CliRunner().invoke(app, ["demo", "--resample-n", "1"])
    assert refused.exit_code == 2 and "resample-n" in refused.output


def test_demo_threads_default_to_the_idle_cores(monkeypatch):
    """Without --threads the demo measures the idle cores when it starts (`with_threads`);
    --threads N is passed as given, and its --help says what the default is."""
    import deploy.demo.run as demo_run

    seen = []
    monkeypatch.setattr(demo_run, "main", lambda opts, tiny: seen.append(opts.threads) or 0)
    assert CliRunner().invoke(app, ["demo"]).exit_code == 0
    assert CliRunner().invoke(app, ["demo", "--threads", "1"]).exit_code == 0
    assert seen == [None, 1]
    helped = " ".join(
        CliRunner().invoke(app, ["demo", "--help"], env={"COLUMNS": "250"}).output.split()
    )
    assert "the cores idle when the demo starts, at most 2" in helped, helped
