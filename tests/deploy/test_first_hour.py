"""The first hour's misconfigurations (issue 35): each start that cannot work stops at once with
one line per problem naming the fix, exit 2, no traceback, nothing written to the registry and
no process left behind."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def arloop(*command: str, timeout: float = 120, **env: str) -> subprocess.CompletedProcess:
    """`arloop <command>` in a fresh interpreter, with only the ARLOOP_* variables given."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("ARLOOP_")}
    return subprocess.run(
        [sys.executable, "-c", "from deploy.cli import app; app(prog_name='arloop')", *command],
        env=clean | {"COLUMNS": "250"} | env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def one_line(result: subprocess.CompletedProcess) -> str:
    """The one line a refused start printed (exit 2, no traceback)."""
    out = (result.stdout + result.stderr).strip()
    assert result.returncode == 2, out
    assert "Traceback" not in out and len(out.splitlines()) == 1, out
    return out


@pytest.mark.parametrize("command", [["serve", "policy"], ["learn", "--once"]])
def test_a_base_model_typo_is_one_line_and_writes_no_registry(
    command, redis_url, redis_client, tmp_path
):
    result = arloop(
        *command,
        ARLOOP_REDIS_URL=redis_url,
        ARLOOP_BASE_MODEL="smolm2",
        ARLOOP_DATA_DIR=str(tmp_path),
    )
    line = one_line(result)
    assert "ARLOOP_BASE_MODEL='smolm2' does not load" in line
    assert "did you mean 'smollm2'?" in line and "tiny" in line
    assert redis_client.keys("arloop:policy:*") == []  # v0 not written with the typo
