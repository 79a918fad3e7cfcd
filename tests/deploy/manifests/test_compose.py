"""compose.yaml: valid against the Compose Specification's JSON schema (the copy
check-jsonschema ships), and wired as the processes read it: variables, secrets through the
image's entrypoint, health checks, the gateway and Prometheus's targets."""

from __future__ import annotations

import json
import re
import secrets
import shutil
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError

from deploy.settings import AgentApiSettings
from tests.deploy.manifests.support import (
    MANIFESTS,
    ROOT,
    build_settings,
    settings_class,
    unread_variables,
)

COMPOSE = MANIFESTS / "compose.yaml"
ARLOOP_SERVICES = ("policy", "agents", "learner")


@pytest.fixture(scope="module")
def compose() -> dict:
    return yaml.safe_load(COMPOSE.read_text())  # PyYAML resolves the `<<:` merge keys


def _schema_check(path: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "check_jsonschema", "--builtin-schema", "vendor.compose-spec"]
        + [str(path)],
        capture_output=True,
        text=True,
        timeout=120,
    )


def _port(service: dict) -> int:
    env = service["environment"]
    port = ("ARLOOP_AGENTS_PORT", "ARLOOP_POLICY_PORT", "ARLOOP_METRICS_PORT")
    return int(next(env[v] for v in port if v in env))


def test_compose_file_is_valid_against_the_compose_specification(tmp_path):
    result = _schema_check(COMPOSE)
    assert result.returncode == 0, result.stdout + result.stderr
    broken = COMPOSE.read_text().replace("start_period: 300s", "start_perod: 300s", 1)
    (tmp_path / "compose.yaml").write_text(broken)
    refused = _schema_check(tmp_path / "compose.yaml")
    assert refused.returncode != 0 and "start_perod" in refused.stdout


def _secret_targets(service: dict) -> dict[str, str]:
    """File name under /run/secrets -> the secret it holds, for a service's `secrets`."""
    out = {}
    for entry in service.get("secrets", []):
        source = entry if isinstance(entry, str) else entry["source"]
        target = source if isinstance(entry, str) else entry.get("target", source)
        out[target] = source
    return out


def _strong_secrets() -> dict[str, str]:
    """A value per secret, as the compose file's header tells people to make them."""
    values = {
        "ARLOOP_SECRET_KEY": secrets.token_hex(32),
        "ARLOOP_API_KEYS": json.dumps([secrets.token_urlsafe(24)]),
    }
    for user in ("agents", "learner", "policy", "vllm-sync"):
        values[f"redis-{user}"] = secrets.token_urlsafe(32)
    for client in ("agents", "learner"):
        values[f"policy-key-{client}"] = secrets.token_urlsafe(32)
    values["ARLOOP_POLICY_KEYS"] = json.dumps(
        [
            {"key": values["policy-key-agents"], "name": "agents"},
            {"key": values["policy-key-learner"], "name": "learner", "gate": True},
        ]
    )
    return values


def _environment_seen(service: dict, values: dict[str, str], folder: Path) -> dict[str, str]:
    """The ARLOOP_* variables the process gets: its environment, then the image's entrypoint
    reading its secrets as compose mounts them (/run/secrets/<target>, with a newline)."""
    folder.mkdir()
    for target, source in _secret_targets(service).items():
        (folder / target).write_text(values[source] + "\n")
    env = {k: str(v) for k, v in service["environment"].items()}
    shown = subprocess.run(
        [
            "sh",
            str(MANIFESTS / "entrypoint.sh"),
            sys.executable,
            "-c",
            "import json, os; print(json.dumps(dict(os.environ)))",
        ],
        env={**env, "SECRETS_DIR": str(folder), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        check=True,
    )
    return {k: v for k, v in json.loads(shown.stdout).items() if k.startswith("ARLOOP_")}


def test_each_process_gets_only_variables_it_reads(compose, monkeypatch, tmp_path):
    values = _strong_secrets()
    for name in ARLOOP_SERVICES:
        service = compose["services"][name]
        cls = settings_class(service["command"])
        env = {**service["environment"], **dict.fromkeys(_secret_targets(service), "x")}
        assert unread_variables(cls, env) == [], name
        seen = _environment_seen(service, values, tmp_path / name)
        settings = build_settings(cls, seen, monkeypatch)
        assert settings.redis_url == "redis://redis:6379/0" and settings.env == "production"
        assert settings.redis_username == f"arloop-{name}"
        user = settings.redis_username.removeprefix("arloop-")
        assert settings.redis_password.get_secret_value() == values[f"redis-{user}"], name


def test_each_process_refuses_a_weak_or_missing_redis_password(compose, monkeypatch, tmp_path):
    for name in ARLOOP_SERVICES:
        service = compose["services"][name]
        cls = settings_class(service["command"])
        weak = _strong_secrets() | {f"redis-{name}": "redis-password"}
        seen = _environment_seen(service, weak, tmp_path / name)
        with pytest.raises(ValidationError, match="Redis password .*too weak"):
            build_settings(cls, seen, monkeypatch)
        seen.pop("ARLOOP_REDIS_PASSWORD")  # the secret file was not written
        with pytest.raises(ValidationError, match="has no credentials"):
            build_settings(cls, seen, monkeypatch)


def test_the_agent_api_gets_its_secrets_from_files_through_the_entrypoint(
    compose, monkeypatch, tmp_path
):
    service = compose["services"]["agents"]
    values = _strong_secrets()
    assert sorted(_secret_targets(service)) == [
        "ARLOOP_API_KEYS",
        "ARLOOP_POLICY_API_KEY",
        "ARLOOP_REDIS_PASSWORD",
        "ARLOOP_SECRET_KEY",
    ]
    for source in compose["secrets"]:
        path = MANIFESTS / compose["secrets"][source]["file"]
        assert path.parent == MANIFESTS / "secrets"
        ignored = subprocess.run(["git", "check-ignore", "-q", str(path)], cwd=ROOT, check=False)
        assert ignored.returncode == 0, f"{path} must be ignored by git"
    seen = _environment_seen(service, values, tmp_path / "secrets")
    settings = build_settings(AgentApiSettings, seen, monkeypatch)
    assert settings.env == "production"
    assert settings.secret_key == values["ARLOOP_SECRET_KEY"]
    keys = [k.key.get_secret_value() for k in settings.api_keys]
    assert keys == json.loads(values["ARLOOP_API_KEYS"])
    assert settings.policy_api_key == values["policy-key-agents"]


def test_the_learner_calls_the_policy_server_with_the_gate_key_and_the_agents_with_theirs(
    compose, monkeypatch, tmp_path
):
    values = _strong_secrets()
    settings = {}
    for name in ARLOOP_SERVICES:
        service = compose["services"][name]
        seen = _environment_seen(service, values, tmp_path / name)
        settings[name] = build_settings(settings_class(service["command"]), seen, monkeypatch)
    served = {k.key.get_secret_value(): k for k in settings["policy"].policy_keys}
    assert len(served) == 2 and [k.name for k in served.values() if k.gate] == ["learner"]
    assert served[settings["learner"].policy_api_key].gate is True
    assert served[settings["agents"].policy_api_key].gate is False
    for name in ("agents", "learner"):
        key = settings[name].policy_config().api_key  # what its policy client sends
        assert key == values[f"policy-key-{name}"] and key in served, name


def test_the_policy_server_refuses_to_start_without_its_keys(compose, monkeypatch, tmp_path):
    service = compose["services"]["policy"]
    cls = settings_class(service["command"])
    assert "ARLOOP_POLICY_KEYS" in _secret_targets(service)
    seen = _environment_seen(service, _strong_secrets(), tmp_path / "policy")
    seen.pop("ARLOOP_POLICY_KEYS")  # the secret file was not written
    with pytest.raises(ValidationError, match="ARLOOP_POLICY_KEYS is empty"):
        build_settings(cls, seen, monkeypatch)


class _Health(BaseHTTPRequestHandler):
    status = 200

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        code = self.status if self.path == "/healthz" else 404
        self.send_response(code)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args) -> None:
        return


def test_health_checks_ask_each_process_its_healthz_and_fail_when_it_fails(compose):
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Health)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        for name in ARLOOP_SERVICES:
            service = compose["services"][name]
            kind, *command = service["healthcheck"]["test"]
            assert kind == "CMD" and command[0] == "python"
            url = f"http://127.0.0.1:{_port(service)}/healthz"
            assert url in command[-1], name
            here = [sys.executable, *command[1:-1], command[-1].replace(url, _url(server))]
            for status, ok in ((200, True), (503, False)):
                _Health.status = status
                done = subprocess.run(here, capture_output=True, timeout=30, check=False)
                assert (done.returncode == 0) == ok, (name, status, done.stderr)
    finally:
        server.shutdown()


def _url(server: ThreadingHTTPServer) -> str:
    return f"http://127.0.0.1:{server.server_address[1]}/healthz"


def test_checkpoints_are_shared_at_the_path_the_registry_names(compose):
    mounts = {}
    for name in ("policy", "learner"):
        service = compose["services"][name]
        (mount,) = [v for v in service["volumes"] if v.startswith("arloop-data:")]
        mounts[name] = mount.split(":")[1]
        assert service["environment"]["ARLOOP_DATA_DIR"] == mounts[name]
    assert mounts["policy"] == mounts["learner"]
    learner = compose["services"]["learner"]
    assert learner.get("deploy", {}).get("replicas", 1) == 1  # one learner at a time
    bases = {compose["services"][n]["environment"]["ARLOOP_BASE_MODEL"] for n in mounts}
    assert len(bases) == 1


def test_redis_runs_on_deploy_manifests_redis_conf_with_the_acl_file_written_first(compose):
    redis = compose["services"]["redis"]
    (mount,) = [v for v in redis["volumes"] if v.startswith("./redis.conf:")]
    (acl_mount,) = [v for v in redis["volumes"] if v.startswith("redis-acl:")]
    acl_folder = acl_mount.split(":")[1]
    assert redis["command"] == [
        "redis-server",
        mount.split(":")[1],
        "--aclfile",
        f"{acl_folder}/users.acl",
    ]
    writer = compose["services"]["redis-acl"]
    assert redis["depends_on"]["redis-acl"]["condition"] == "service_completed_successfully"
    assert writer["command"][-1] == f"{acl_folder}/users.acl"
    assert f"redis-acl:{acl_folder}" in writer["volumes"]
    users = {t: compose["secrets"][s]["file"] for t, s in _secret_targets(writer).items()}
    assert users == {
        u: f"./secrets/redis-{u}" for u in ("agents", "learner", "policy", "vllm-sync")
    }
    for name in ARLOOP_SERVICES:
        url = compose["services"][name]["environment"]["ARLOOP_REDIS_URL"]
        assert url.startswith("redis://redis:6379/")


def test_the_gateway_and_prometheus_reach_the_services_on_their_ports(compose):
    services = compose["services"]
    nginx = (MANIFESTS / "nginx.conf").read_text()
    (upstream,) = re.findall(r"set \$agents http://([\w-]+):(\d+);", nginx)
    assert upstream == ("agents", str(_port(services["agents"])))
    (listen,) = re.findall(r"listen (\d+);", nginx)
    (published,) = services["gateway"]["ports"]
    assert published.rsplit(":", 1)[1] == listen
    scrape = yaml.safe_load((MANIFESTS / "prometheus.yml").read_text())["scrape_configs"]
    targets = set()
    for job in scrape:
        for static in job.get("static_configs", []):
            targets |= set(static["targets"])
        for dns in job.get("dns_sd_configs", []):
            targets |= {f"{n}:{dns['port']}" for n in dns["names"]}
    assert targets == {f"{n}:{_port(services[n])}" for n in ARLOOP_SERVICES}
    assert services["prometheus"]["profiles"] == ["monitoring"]  # optional


@pytest.mark.parametrize(
    "tool, command",
    [
        ("nginx", ["-t", "-c"]),
        ("promtool", ["check", "config", str(MANIFESTS / "prometheus.yml")]),
    ],
)
def test_the_gateway_and_prometheus_configs_pass_their_own_checkers(tool, command, tmp_path):
    binary = shutil.which(tool) or shutil.which(tool, path="/usr/sbin")
    if binary is None:
        pytest.skip(f"{tool} is not installed (Debian: apt-get install nginx-light prometheus)")
    if tool == "nginx":  # the gateway's file is a server block: wrap it as nginx's image does
        main = tmp_path / "nginx.conf"
        main.write_text(
            f"pid {tmp_path}/nginx.pid; error_log {tmp_path}/error.log; events {{}}\n"
            f"http {{ access_log off; include {MANIFESTS / 'nginx.conf'}; }}\n"
        )
        command = [*command, str(main)]
    done = subprocess.run([binary, *command], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
