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


def test_each_process_gets_only_variables_it_reads(compose, monkeypatch):
    for name in ARLOOP_SERVICES:
        service = compose["services"][name]
        cls = settings_class(service["command"])
        env = {**service["environment"], **{s: "x" for s in service.get("secrets", [])}}
        assert unread_variables(cls, env) == [], name
        if cls is not AgentApiSettings:  # its secrets come from files: the next test
            settings = build_settings(cls, service["environment"], monkeypatch)
            assert settings.redis_url == "redis://redis:6379/0" and settings.env == "production"


def test_the_agent_api_gets_its_secrets_from_files_through_the_entrypoint(
    compose, monkeypatch, tmp_path
):
    service = compose["services"]["agents"]
    files = {
        "ARLOOP_SECRET_KEY": secrets.token_hex(32) + "\n",
        "ARLOOP_API_KEYS": json.dumps([secrets.token_urlsafe(24)]) + "\n",
    }
    assert sorted(service["secrets"]) == sorted(files)
    for name, value in files.items():
        source = compose["secrets"][name]["file"]
        assert (MANIFESTS / source).parent == MANIFESTS / "secrets"
        ignored = subprocess.run(
            ["git", "check-ignore", "-q", str(MANIFESTS / source)], cwd=ROOT, check=False
        )
        assert ignored.returncode == 0, f"{source} must be ignored by git"
        (tmp_path / name).write_text(value)  # as compose mounts it: /run/secrets/<name>
    env = {k: str(v) for k, v in service["environment"].items()}
    shown = subprocess.run(
        [
            "sh",
            str(MANIFESTS / "entrypoint.sh"),
            sys.executable,
            "-c",
            "import json, os; print(json.dumps(dict(os.environ)))",
        ],
        env={**env, "SECRETS_DIR": str(tmp_path), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        check=True,
    )
    seen = {k: v for k, v in json.loads(shown.stdout).items() if k.startswith("ARLOOP_")}
    settings = build_settings(AgentApiSettings, seen, monkeypatch)
    assert settings.env == "production"
    assert settings.secret_key == files["ARLOOP_SECRET_KEY"].strip()
    assert settings.api_keys == json.loads(files["ARLOOP_API_KEYS"])


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


def test_redis_runs_on_deploy_manifests_redis_conf(compose):
    redis = compose["services"]["redis"]
    (mount,) = [v for v in redis["volumes"] if v.startswith("./redis.conf:")]
    assert redis["command"] == ["redis-server", mount.split(":")[1]]
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
