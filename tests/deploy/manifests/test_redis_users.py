"""Redis as the manifests start it: `redis-acl.sh` writes the ACL file from one password file
per user, redis-server loads it, and each process, with the environment its manifest gives
it, logs in as its own user (and only as that user can it write what it owns)."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest
import redis
import yaml

from agents.events import POLICY_ALIASES, STREAM_FEEDBACK, serving_key
from deploy.embedded_redis import free_port, redis_server_binary
from tests.deploy.manifests.kustomize import render
from tests.deploy.manifests.support import (
    K8S,
    MANIFESTS,
    arloop_containers,
    build_settings,
    by_id,
    container_env,
    settings_class,
)

USERS = ("agents", "learner", "policy", "vllm-sync")


def _write_acl(passwords: dict[str, str], folder: Path) -> subprocess.CompletedProcess:
    folder.mkdir(exist_ok=True)
    for user, password in passwords.items():
        (folder / user).write_text(password + "\n")  # as a Secret or a compose file holds it
    return subprocess.run(
        ["sh", str(MANIFESTS / "redis-acl.sh"), str(MANIFESTS / "redis-acl.conf")]
        + [str(folder), str(folder / "users.acl")],
        capture_output=True,
        text=True,
        timeout=30,
    )


@pytest.fixture
def start_redis(tmp_path):
    """redis-server (PATH's: Redis 7, the ACL file needs it) on redis.conf and an ACL file."""
    procs = []

    def start(acl: Path) -> int:
        port = free_port()
        proc = subprocess.Popen(
            [redis_server_binary(), str(MANIFESTS / "redis.conf"), "--aclfile", str(acl)]
            + ["--port", str(port), "--bind", "127.0.0.1"],
            cwd=tmp_path,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        procs.append(proc)
        anonymous = redis.Redis(port=port)
        for _ in range(200):
            try:
                anonymous.ping()
            except redis.AuthenticationError:
                return port  # up, and the `default` user is off
            except redis.ConnectionError:
                assert proc.poll() is None, proc.stdout.read().decode()
                time.sleep(0.05)
            else:
                raise AssertionError("an anonymous client got in")
        raise AssertionError("redis-server did not start")

    yield start
    for proc in procs:
        proc.kill()
        proc.wait()


def _login(settings, port: int) -> redis.Redis:
    """A client as the process makes one (its settings' options), pointed at the test server."""
    url = f"redis://127.0.0.1:{port}/0"
    return redis.Redis.from_url(url, **settings.redis_options(url))


def _check_who_may_write_what(clients: dict[str, redis.Redis]) -> None:
    for client in clients.values():
        assert client.ping()
    clients["learner"].hset(POLICY_ALIASES, "champion", "v0")  # the learner owns the registry
    clients["agents"].xadd(STREAM_FEEDBACK, {"x": "1"})
    assert clients["agents"].hget(POLICY_ALIASES, "champion") == b"v0"
    with pytest.raises(redis.exceptions.NoPermissionError):
        clients["agents"].hset(POLICY_ALIASES, "champion", "v1")
    if "vllm-sync" in clients:
        clients["vllm-sync"].set(serving_key("vllm:engine"), "{}")
        with pytest.raises(redis.exceptions.NoPermissionError):
            clients["vllm-sync"].hset(POLICY_ALIASES, "champion", "v1")
    assert clients["learner"].hget(POLICY_ALIASES, "champion") == b"v0"


def test_the_kubernetes_secrets_start_redis_and_log_each_process_in(
    tmp_path, start_redis, monkeypatch
):
    docs = render(K8S / "overlays" / "cpu-laptop")  # development: the Secret's values work
    passwords = by_id(docs)["Secret", "arloop-redis-users"]["stringData"]
    assert sorted(passwords) == sorted(USERS)
    written = _write_acl(passwords, tmp_path / "users")
    assert written.returncode == 0, written.stderr
    port = start_redis(tmp_path / "users" / "users.acl")
    clients = {}
    for _, container in arloop_containers(docs):
        env = container_env(docs, container)
        settings = build_settings(settings_class(container["args"]), env, monkeypatch)
        clients[settings.redis_username.removeprefix("arloop-")] = _login(settings, port)
    _check_who_may_write_what(clients)
    wrong = redis.Redis(port=port, username="arloop-learner", password=passwords["agents"])
    with pytest.raises(redis.AuthenticationError):
        wrong.ping()  # one user's password is not another's


def test_the_compose_secret_files_start_redis_and_log_each_process_in(
    tmp_path, start_redis, monkeypatch
):
    from tests.deploy.manifests.test_compose import _environment_seen, _strong_secrets

    compose = yaml.safe_load((MANIFESTS / "compose.yaml").read_text())
    values = _strong_secrets()
    written = _write_acl({u: values[f"redis-{u}"] for u in USERS}, tmp_path / "users")
    assert written.returncode == 0, written.stderr
    port = start_redis(tmp_path / "users" / "users.acl")
    clients = {}
    for name in ("agents", "learner", "policy"):
        service = compose["services"][name]
        seen = _environment_seen(service, values, tmp_path / name)
        settings = build_settings(settings_class(service["command"]), seen, monkeypatch)
        clients[name] = _login(settings, port)
    _check_who_may_write_what(clients)


@pytest.mark.parametrize("problem", ["missing", "short"])
def test_the_acl_writer_refuses_a_missing_or_short_password(tmp_path, problem):
    passwords = {u: f"{u}-" + "k9Xq2" * 8 for u in USERS}
    if problem == "missing":
        del passwords["policy"]
    else:
        passwords["policy"] = "changeme"
    written = _write_acl(passwords, tmp_path)
    assert written.returncode == 1
    assert "policy" in written.stderr and not (tmp_path / "users.acl").exists()
    assert not (tmp_path / "users.acl.partial").exists()


def test_the_acl_file_holds_hashes_never_passwords(tmp_path):
    passwords = {u: f"{u}-" + "k9Xq2" * 8 for u in USERS}
    assert _write_acl(passwords, tmp_path).returncode == 0
    text = (tmp_path / "users.acl").read_text()
    assert not any(p in text for p in passwords.values())
    assert text.count(" on #") == len(USERS)


def test_shellcheck_passes_the_acl_writer():
    from tests.deploy.manifests.test_image import SCRIPTS as BIN

    done = subprocess.run(
        [str(BIN / "shellcheck"), "--shell=sh", str(MANIFESTS / "redis-acl.sh")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stdout
