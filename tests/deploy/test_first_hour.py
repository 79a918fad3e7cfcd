"""The first hour's misconfigurations (issue 35): each start that cannot work stops at once with
one line per problem naming the fix, exit 2, no traceback, nothing written to the registry and
no process left behind."""

import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import redis

from deploy.embedded_redis import free_port, start_redis
from learner.policy.models import resolve_base
from learner.policy.registry import PolicyRegistry
from tests.model_cache import MODEL_CACHE

ROOT = Path(__file__).resolve().parents[2]


def arloop(*command: str, timeout: float = 120, **env: str) -> subprocess.CompletedProcess:
    """`arloop <command>` in a fresh interpreter, with only the ARLOOP_* variables given and
    the session's model cache (its tiny model built: a first build's progress is not the
    refusal's one line, and tests never write to the user's cache)."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("ARLOOP_")}
    resolve_base("tiny", cache_dir=MODEL_CACHE)
    return subprocess.run(
        [sys.executable, "-c", "from deploy.cli import app; app(prog_name='arloop')", *command],
        env=clean | {"COLUMNS": "250", "ARLOOP_MODEL_CACHE": str(MODEL_CACHE)} | env,
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


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("localhost:6379", "'localhost:6379' has no scheme: write redis://localhost:6379/0"),
        (
            "redis://127.0.0.1:six/0",
            "the port 'six' is not a number, e.g. redis://127.0.0.1:6379/0",
        ),
        ("http://127.0.0.1:6379", "http:// is not a Redis URL scheme: use redis://host:6379/0"),
        ("redis://127.0.0.1:6379/zero", "the database 'zero' is not a number: end the URL with /0"),
    ],
)
@pytest.mark.parametrize("command", [["serve", "agents"], ["learn", "--once"]])
def test_a_malformed_redis_url_is_one_line_with_the_fix(command, url, says, tmp_path):
    line = one_line(arloop(*command, ARLOOP_REDIS_URL=url, ARLOOP_DATA_DIR=str(tmp_path)))
    assert f"ARLOOP_REDIS_URL: {says}" in line


def test_learn_once_with_a_redis_that_does_not_answer_is_one_line(tmp_path):
    port = free_port()
    result = arloop(
        "learn",
        "--once",
        ARLOOP_REDIS_URL=f"redis://127.0.0.1:{port}/0",
        ARLOOP_BASE_MODEL="tiny",
        ARLOOP_DATA_DIR=str(tmp_path),
    )
    line = one_line(result)
    assert line.startswith(f"arloop learn: the Redis at 127.0.0.1:{port} does not answer (")
    assert line.endswith("start it, or fix ARLOOP_REDIS_URL")


def test_the_agent_api_says_once_it_waits_for_redis_and_serves_when_redis_comes_up(tmp_path):
    redis_port, api_port = free_port(), free_port()
    log = tmp_path / "agents.log"
    clean = {k: v for k, v in os.environ.items() if not k.startswith("ARLOOP_")}
    env = clean | {
        "ARLOOP_REDIS_URL": f"redis://127.0.0.1:{redis_port}/0",
        "ARLOOP_AGENTS_PORT": str(api_port),
        "ARLOOP_LOG_FORMAT": "text",
        "ARLOOP_DATA_DIR": str(tmp_path),
    }
    with open(log, "w") as out:
        api = subprocess.Popen(
            [sys.executable, "-m", "deploy.cli", "serve", "agents"],
            env=env,
            cwd=ROOT,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    server = None
    try:
        assert _healthz(api_port, until=503) == 503, log.read_text()
        waiting = [line for line in log.read_text().splitlines() if "waiting for Redis" in line]
        assert len(waiting) == 1, log.read_text()
        assert waiting[0].endswith("; /healthz reports not ready until it answers")
        assert f"waiting for Redis at 127.0.0.1:{redis_port} (" in waiting[0]
        server = start_redis(tmp_path / "redis", port=redis_port)
        assert _healthz(api_port, until=200) == 200, log.read_text()
        said = f"Redis at 127.0.0.1:{redis_port} answers"
        deadline = time.monotonic() + 10  # its watcher asks every second
        while said not in log.read_text() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert said in log.read_text(), log.read_text()
    finally:
        api.terminate()
        api.wait(timeout=30)
        if server is not None:
            server.stop()


def _healthz(port: int, until: int, timeout_s: float = 60) -> int | None:
    """GET /healthz until it answers `until` (or time runs out): the last status seen."""
    status = None
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            status = httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=5).status_code
        except httpx.HTTPError:
            status = None
        if status == until:
            return status
        time.sleep(0.3)
    return status


def lines(result: subprocess.CompletedProcess) -> list[str]:
    """The lines a refused start printed, one per problem (exit 2, no traceback)."""
    out = (result.stdout + result.stderr).strip()
    assert result.returncode == 2, out
    assert "Traceback" not in out, out
    return out.splitlines()


@pytest.fixture
def taken_port():
    """A port something else listens on."""
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        yield holder.getsockname()[1]


@pytest.mark.parametrize(("command", "process"), [("agents", "AGENTS"), ("policy", "POLICY")])
def test_a_port_in_use_is_one_line_naming_port_and_the_setting(
    command, process, taken_port, redis_url, tmp_path
):
    result = arloop(
        "serve",
        command,
        "--port",
        str(taken_port),
        ARLOOP_REDIS_URL=redis_url,
        ARLOOP_BASE_MODEL="tiny",
        ARLOOP_DATA_DIR=str(tmp_path),
    )
    line = one_line(result)
    assert f"port {taken_port} on 127.0.0.1 is already in use" in line
    assert f"--port {taken_port + 1} or ARLOOP_{process}_PORT={taken_port + 1}" in line


def test_every_problem_of_a_start_is_reported_at_once_before_redis_starts(taken_port, tmp_path):
    result = arloop(
        "serve",
        "policy",
        "--port",
        str(taken_port),
        ARLOOP_BASE_MODEL="smolm2",
        ARLOOP_DATA_DIR=str(tmp_path),
    )
    said = lines(result)
    assert len(said) == 2, said
    assert f"port {taken_port} on 127.0.0.1 is already in use" in said[0]
    assert "ARLOOP_BASE_MODEL='smolm2' does not load" in said[1]
    assert not (tmp_path / "redis").exists()  # the embedded Redis was never started


def test_a_pack_with_a_wrong_agent_kind_is_refused_in_one_line(tmp_path, taken_port):
    (tmp_path / "graph_pack.py").write_text(
        "from agents.packs import Pack\nfrom agents.runtime import AgentSpec\n"
        "pack = Pack('mine', (AgentSpec(name='mine', description='d', system_prompt='s', "
        "kind=object()),))\n"
    )
    result = arloop(
        "serve",
        "agents",
        ARLOOP_PACKS='["graph_pack:pack"]',
        ARLOOP_DATA_DIR=str(tmp_path),
        PYTHONPATH=str(tmp_path),
    )
    line = one_line(result)
    assert "AgentSpec 'mine': kind is an object, not one of 'react', 'reflexion'" in line
    assert line.startswith("arloop serve agents: agent pack 'graph_pack:pack': ")


@pytest.mark.parametrize(("command", "n"), [("agents", 3), ("policy", 2)])
def test_production_problems_are_reported_all_at_once(command, n, tmp_path):
    result = arloop(
        "serve",
        command,
        ARLOOP_ENV="production",
        ARLOOP_SECRET_KEY="short",
        ARLOOP_API_KEYS='["dev-key"]',
        ARLOOP_DATA_DIR=str(tmp_path),
    )
    said = lines(result)
    assert len(said) == n, said
    assert all(line.startswith(f"arloop serve {command}: ") for line in said), said
    assert "ARLOOP_REDIS_URL must be set in production" in said[0]
    if command == "agents":
        assert "ARLOOP_SECRET_KEY is too weak" in said[1] and "development key" in said[2]
    else:
        assert "ARLOOP_POLICY_KEYS is empty" in said[1]


def _embedded_left_running(data_dir: Path) -> bool:
    """Whether the embedded Redis of `data_dir` still answers after the command exited."""
    port = (data_dir / "redis" / "port").read_text().strip()  # it was started: its port
    try:
        with redis.Redis(port=int(port), socket_connect_timeout=0.5) as client:
            return bool(client.ping())
    except redis.RedisError:
        return False


def _registry_of_another_base(data_dir: Path) -> tuple[int, str]:
    """An embedded Redis's data whose registry was made with 'tiny' (the server stopped again):
    (its port, a base model that loads but is not v0's)."""
    before = start_redis(data_dir / "redis")
    with redis.Redis.from_url(before.url) as client:
        PolicyRegistry(client).ensure_base("tiny")
    before.stop()
    return before.port, str(resolve_base("tiny", cache_dir=MODEL_CACHE))


@pytest.mark.parametrize(
    "command", [["learn", "--once"], ["serve", "policy"]], ids=["learn", "policy"]
)
def test_a_refused_start_stops_the_embedded_redis_it_started(command, tmp_path):
    port, other = _registry_of_another_base(tmp_path)
    result = arloop(
        *command,
        ARLOOP_BASE_MODEL=other,
        ARLOOP_POLICY_ENGINE="transformers",
        ARLOOP_POLICY_PORT=str(free_port()),
        ARLOOP_DATA_DIR=str(tmp_path),
    )
    assert "but this registry (its v0) was created with 'tiny'" in one_line(result)
    assert (tmp_path / "redis" / "port").read_text().strip() != str(port)  # it started one
    assert not _embedded_left_running(tmp_path)


def test_a_refused_start_leaves_an_embedded_redis_it_found_running(tmp_path):
    _, other = _registry_of_another_base(tmp_path)
    running = start_redis(tmp_path / "redis")
    try:
        result = arloop("learn", "--once", ARLOOP_BASE_MODEL=other, ARLOOP_DATA_DIR=str(tmp_path))
        assert "but this registry (its v0) was created with 'tiny'" in one_line(result)
        assert _embedded_left_running(tmp_path)  # another process's: not ours to stop
    finally:
        running.stop()


def test_learn_reports_every_start_problem_at_once_before_redis_starts(tmp_path):
    result = arloop(
        "learn",
        "--once",
        ARLOOP_BASE_MODEL="smolm2",
        ARLOOP_EVAL_PACKS='["nope"]',
        ARLOOP_DATA_DIR=str(tmp_path),
    )
    said = lines(result)
    assert len(said) == 2, said
    assert "ARLOOP_BASE_MODEL='smolm2' does not load" in said[0]
    assert "unknown agent pack 'nope'" in said[1] and said[1].endswith("fix ARLOOP_EVAL_PACKS")
    assert not (tmp_path / "redis").exists()


def test_make_install_without_a_recent_enough_python_names_the_fix(tmp_path):
    """`make install` with only pythons below pyproject's floor (Debian 12's python3 is
    3.11.2) stops before creating anything and says what to install or name."""
    floor = re.search(r'requires-python = ">=([\d.]+)"', (ROOT / "pyproject.toml").read_text())
    makefile = (ROOT / "Makefile").read_text()
    floor_tuple = ", ".join(floor.group(1).split("."))
    assert f"sys.version_info < ({floor_tuple})" in makefile  # the Makefile's floor is pyproject's
    old = tmp_path / "bin"
    old.mkdir()
    for name in ("python3", "python3.13", "python3.12", "python3.11"):  # each too old
        (old / name).write_text('#!/bin/sh\necho "Python 3.11.2"; exit 1\n')
        (old / name).chmod(0o755)
    venv = tmp_path / "venv"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHON", "VIRTUAL_ENV", "MAKEFLAGS")}
    result = subprocess.run(
        ["make", "--no-print-directory", "install", f"VENV={venv}"],
        env=env | {"PATH": f"{old}:/usr/bin:/bin"},
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    out = result.stdout + result.stderr
    assert result.returncode != 0, out
    assert f"needs Python >= {floor.group(1)}" in out and "make PYTHON=" in out, out
    assert "(python3 is Python 3.11.2)" in out, out
    assert not venv.exists()
