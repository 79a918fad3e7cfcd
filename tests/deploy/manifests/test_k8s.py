"""The Kubernetes manifests: each overlay rendered, every resource valid against the Kubernetes
schemas (kubernetes-validate's strict JSON schemas, shipped in its wheel), and the wiring a
schema cannot see: the variables each process reads, ports, probes, volumes, selectors."""

from __future__ import annotations

import copy
import json
import secrets
from urllib.parse import urlparse

import kubernetes_validate
import pytest
from pydantic import ValidationError

from deploy.learn.settings import LearnerSettings
from deploy.policy_server.settings import PolicyServerSettings
from deploy.settings import AgentApiSettings
from tests.deploy.manifests.kustomize import render
from tests.deploy.manifests.support import (
    K8S,
    MANIFESTS,
    OVERLAYS,
    arloop_containers,
    build_settings,
    by_id,
    container_env,
    settings_class,
    unread_variables,
    variables,
    workloads,
)

# The oldest Kubernetes we claim and the newest the schemas know.
KUBERNETES_VERSIONS = ("1.29.0", kubernetes_validate.latest_version())
# Each process's port: its settings field, and the port the manifests must give it.
PORTS = {AgentApiSettings: ("port", 8000), PolicyServerSettings: ("port", 8001)}
PORTS[LearnerSettings] = ("metrics_port", 8002)
EXPECTED = {
    ("Deployment", "arloop-agent-api"),
    ("Deployment", "arloop-policy"),
    ("Deployment", "arloop-learner"),
    ("StatefulSet", "arloop-redis"),
    ("Service", "arloop-agent-api"),
    ("Service", "arloop-policy"),
    ("Service", "arloop-learner"),
    ("Service", "arloop-redis"),
    ("PodDisruptionBudget", "arloop-agent-api"),
    ("Secret", "arloop-secrets"),
    ("Secret", "arloop-redis-users"),
    ("Secret", "arloop-policy-keys"),
    ("PersistentVolumeClaim", "arloop-data"),
}


@pytest.fixture(scope="module", params=OVERLAYS)
def overlay(request) -> tuple[str, list[dict]]:
    return request.param, render(K8S / "overlays" / request.param)


def _port_number(container: dict, port: int | str) -> int:
    if isinstance(port, int):
        return port
    (found,) = [p["containerPort"] for p in container["ports"] if p["name"] == port]
    return found


def _selects(selector: dict[str, str], workload: dict) -> bool:
    labels = workload["spec"]["template"]["metadata"]["labels"]
    return all(labels.get(k) == v for k, v in selector.items())


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_every_resource_is_valid_against_the_kubernetes_schemas(overlay, version):
    name, docs = overlay
    assert EXPECTED <= set(by_id(docs)), f"{name} lacks {EXPECTED - set(by_id(docs))}"
    for doc in docs:
        kubernetes_validate.validate(doc, version, strict=True)  # raises with the path


def test_the_schema_validation_refuses_a_misspelt_field(overlay):
    _, docs = overlay
    broken = copy.deepcopy(by_id(docs)["Deployment", "arloop-agent-api"])
    broken["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]["httpGet"]["pth"] = "/"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, KUBERNETES_VERSIONS[-1], strict=True)


def _with_real_secrets(docs: list[dict]) -> list[dict]:
    """The rendered resources with the placeholder Secrets replaced, as an operator must."""
    docs = copy.deepcopy(docs)
    objects = by_id(docs)
    objects["Secret", "arloop-secrets"]["stringData"] = {
        "ARLOOP_SECRET_KEY": secrets.token_hex(32),
        "ARLOOP_API_KEYS": json.dumps([secrets.token_urlsafe(24)]),
    }
    users = objects["Secret", "arloop-redis-users"]["stringData"]
    for user in users:
        users[user] = secrets.token_urlsafe(32)
    keys = {client: secrets.token_urlsafe(32) for client in ("agents", "learner")}
    served = [
        {"key": keys["agents"], "name": "agents"},
        {"key": keys["learner"], "name": "learner", "gate": True},
    ]
    objects["Secret", "arloop-policy-keys"]["stringData"] = keys | {
        "ARLOOP_POLICY_KEYS": json.dumps(served)
    }
    return docs


def test_each_process_gets_only_variables_it_reads_and_its_settings_accept_them(
    overlay, monkeypatch
):
    name, docs = overlay
    if name == "gpu":  # production: the placeholders are refused (the next test)
        docs = _with_real_secrets(docs)
    seen = set()
    for workload, container in arloop_containers(docs):
        cls = settings_class(container["args"])
        seen.add(cls)
        env = container_env(docs, container)
        assert unread_variables(cls, env) == [], f"{workload['metadata']['name']} in {name}"
        settings = build_settings(cls, env, monkeypatch)
        assert settings.redis_url == env["ARLOOP_REDIS_URL"]
        user = settings.redis_username.removeprefix("arloop-")
        password = by_id(docs)["Secret", "arloop-redis-users"]["stringData"][user]
        assert settings.redis_password.get_secret_value() == password
    assert seen == set(PORTS)


def test_the_learner_calls_the_policy_server_with_the_gate_key_and_the_agents_with_theirs(
    overlay, monkeypatch
):
    name, docs = overlay
    if name == "gpu":
        docs = _with_real_secrets(docs)
    settings = {
        c["args"][-1]: build_settings(
            settings_class(c["args"]), container_env(docs, c), monkeypatch
        )
        for _, c in arloop_containers(docs)
    }
    served = {k.key.get_secret_value(): k for k in settings["policy"].policy_keys}
    assert len(served) == 2 and [k.name for k in served.values() if k.gate] == ["learner"]
    assert served[settings["learn"].policy_api_key].gate is True, name
    assert served[settings["agents"].policy_api_key].gate is False, name
    stored = by_id(docs)["Secret", "arloop-policy-keys"]["stringData"]
    assert settings["learn"].policy_config().api_key == stored["learner"]
    assert settings["agents"].policy_config().api_key == stored["agents"]


def test_each_process_has_its_own_redis_user():
    docs = render(K8S / "overlays" / "gpu")
    users = [container_env(docs, c)["ARLOOP_REDIS_USERNAME"] for _, c in arloop_containers(docs)]
    assert sorted(users) == ["arloop-agents", "arloop-learner", "arloop-policy"]
    acl = (MANIFESTS / "redis-acl.conf").read_text()
    for user in users:
        assert f"user {user} on ><{user.removeprefix('arloop-')}-password> " in acl


def test_production_refuses_the_placeholder_secrets_until_they_are_replaced(monkeypatch):
    docs = render(K8S / "overlays" / "gpu")
    real = by_id(_with_real_secrets(docs))
    for _, container in arloop_containers(docs):
        env = container_env(docs, container)
        assert env["ARLOOP_ENV"] == "production"
        with pytest.raises(ValidationError, match="Redis password .*development value"):
            build_settings(settings_class(container["args"]), env, monkeypatch)
    by_id(docs)["Secret", "arloop-redis-users"].update(real["Secret", "arloop-redis-users"])
    others = _with_real_secrets(docs)  # all but the policy keys replaced
    placeholders = by_id(docs)["Secret", "arloop-policy-keys"]["stringData"]
    by_id(others)["Secret", "arloop-policy-keys"]["stringData"] = dict(placeholders)
    refusals = {
        "policy": "policy key 'agents' is too weak .*development value",
        "agents": "ARLOOP_POLICY_API_KEY is the development value",
        "learn": "ARLOOP_POLICY_API_KEY is the development value",
    }
    for _, container in arloop_containers(others):
        env = container_env(others, container)
        with pytest.raises(ValidationError, match=refusals[container["args"][-1]]):
            build_settings(settings_class(container["args"]), env, monkeypatch)
    by_id(docs)["Secret", "arloop-policy-keys"].update(real["Secret", "arloop-policy-keys"])
    (container,) = [c for _, c in arloop_containers(docs) if c["args"][-1] == "agents"]
    secret = by_id(docs)["Secret", "arloop-secrets"]["stringData"]
    with pytest.raises(ValidationError, match="ARLOOP_SECRET_KEY"):
        build_settings(AgentApiSettings, container_env(docs, container), monkeypatch)
    secret["ARLOOP_SECRET_KEY"] = "f" * 64  # long, but no entropy
    with pytest.raises(ValidationError, match="ARLOOP_SECRET_KEY.*bits of entropy"):
        build_settings(AgentApiSettings, container_env(docs, container), monkeypatch)
    secret["ARLOOP_SECRET_KEY"] = real["Secret", "arloop-secrets"]["stringData"][
        "ARLOOP_SECRET_KEY"
    ]
    with pytest.raises(ValidationError, match="ARLOOP_API_KEYS"):
        build_settings(AgentApiSettings, container_env(docs, container), monkeypatch)
    secret["ARLOOP_API_KEYS"] = '["k-0123456789abcdef"]'  # 18 characters: too short
    with pytest.raises(ValidationError, match="ARLOOP_API_KEYS"):
        build_settings(AgentApiSettings, container_env(docs, container), monkeypatch)
    key = secrets.token_urlsafe(24)
    secret["ARLOOP_API_KEYS"] = json.dumps([key])
    settings = build_settings(AgentApiSettings, container_env(docs, container), monkeypatch)
    assert [k.key.get_secret_value() for k in settings.api_keys] == [key]
    assert settings.secret_key == secret["ARLOOP_SECRET_KEY"]


def test_the_laptop_overlay_runs_in_development_with_the_development_secrets(monkeypatch):
    docs = render(K8S / "overlays" / "cpu-laptop")
    (container,) = [c for _, c in arloop_containers(docs) if c["args"][-1] == "agents"]
    settings = build_settings(AgentApiSettings, container_env(docs, container), monkeypatch)
    assert settings.env == "development"
    assert [k.key.get_secret_value() for k in settings.api_keys] == ["dev-key"]


def test_probes_ports_and_services_meet_each_process(overlay, monkeypatch):
    name, docs = overlay
    services = [d for d in docs if d["kind"] == "Service"]
    for workload, container in arloop_containers(docs):
        cls = settings_class(container["args"])
        env = container_env(docs, container)
        field, expected = PORTS[cls]
        port = int(env[variables(cls, field)[0]])  # the process's own variable, not ARLOOP_PORT
        assert port == expected == cls.model_fields[field].default, (name, field)
        if cls is not LearnerSettings:
            assert env[variables(cls, "host")[0]] == "0.0.0.0"  # reachable from outside the pod
        else:
            assert env["ARLOOP_METRICS_HOST"] == "0.0.0.0"
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            get = container[probe]["httpGet"]
            assert get["path"] == "/healthz", (name, probe)
            assert _port_number(container, get["port"]) == port, (name, probe)
        (service,) = [s for s in services if _selects(s["spec"]["selector"], workload)]
        (service_port,) = service["spec"]["ports"]
        assert service_port["port"] == port
        assert _port_number(container, service_port["targetPort"]) == port
        annotations = workload["spec"]["template"]["metadata"]["annotations"]
        assert annotations["prometheus.io/port"] == str(port)


def test_every_service_and_the_budget_select_exactly_one_workload(overlay):
    _, docs = overlay
    selectors = [d["spec"]["selector"] for d in docs if d["kind"] == "Service"]
    selectors += [
        d["spec"]["selector"]["matchLabels"] for d in docs if d["kind"] == "PodDisruptionBudget"
    ]
    for selector in selectors:
        assert len([w for w in workloads(docs) if _selects(selector, w)]) == 1, selector
    for workload in workloads(docs):
        assert _selects(workload["spec"]["selector"]["matchLabels"], workload)
    (budget,) = [d for d in docs if d["kind"] == "PodDisruptionBudget"]
    (target,) = [
        w for w in workloads(docs) if _selects(budget["spec"]["selector"]["matchLabels"], w)
    ]
    assert target["metadata"]["name"] == "arloop-agent-api"


def test_one_learner_at_a_time(overlay):
    _, docs = overlay
    learner = by_id(docs)["Deployment", "arloop-learner"]
    assert learner["spec"]["replicas"] == 1
    assert learner["spec"]["strategy"]["type"] == "Recreate"  # never two during a rollout


def test_checkpoints_are_shared_at_the_path_the_registry_names(overlay):
    name, docs = overlay
    mounts = {}
    for workload, container in arloop_containers(docs):
        claims = {
            v["name"]: v["persistentVolumeClaim"]["claimName"]
            for v in workload["spec"]["template"]["spec"].get("volumes", [])
            if "persistentVolumeClaim" in v
        }
        for mount in container.get("volumeMounts", []):
            if claims.get(mount["name"]) == "arloop-data":
                mounts[container["args"][-1]] = mount
                assert container_env(docs, container)["ARLOOP_DATA_DIR"] == mount["mountPath"]
    assert set(mounts) == {"policy", "learn"}, name
    assert mounts["policy"]["mountPath"] == mounts["learn"]["mountPath"]
    assert mounts["policy"].get("readOnly") and not mounts["learn"].get("readOnly")
    claim = by_id(docs)["PersistentVolumeClaim", "arloop-data"]
    modes = claim["spec"]["accessModes"]
    assert modes == (["ReadWriteOnce"] if name == "cpu-laptop" else ["ReadWriteMany"])


def test_the_processes_find_each_other_by_service_name(overlay):
    _, docs = overlay
    services = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Service"}
    for _, container in arloop_containers(docs):
        env = container_env(docs, container)
        for variable in ("ARLOOP_REDIS_URL", "ARLOOP_POLICY_API_BASE"):
            if variable not in env:
                continue
            url = urlparse(env[variable])
            service = services[url.hostname]
            assert url.port in [p["port"] for p in service["spec"]["ports"]], variable
    policy = [container_env(docs, c) for _, c in arloop_containers(docs)]
    models = {e["ARLOOP_BASE_MODEL"] for e in policy if "ARLOOP_BASE_MODEL" in e}
    assert len(models) == 1, "the policy server and the learner must share the base model"


def test_resources_security_and_images(overlay):
    name, docs = overlay
    tag = {"cpu-laptop": "cpu", "gpu": "cuda"}[name]
    for workload in workloads(docs):
        pod = workload["spec"]["template"]["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert pod["securityContext"]["runAsUser"] != 0
        for container in pod["containers"]:
            assert {"cpu", "memory"} <= set(container["resources"]["requests"])
            assert "memory" in container["resources"]["limits"]
            assert container["securityContext"]["allowPrivilegeEscalation"] is False
    for _, container in arloop_containers(docs):
        assert container["image"] == f"arloop:{tag}"
    policy = by_id(docs)["Deployment", "arloop-policy"]["spec"]["template"]["spec"]
    device = by_id(docs)["ConfigMap", "arloop-policy-config"]["data"]["ARLOOP_DEVICE"]
    gpus = policy["containers"][0]["resources"]["limits"].get("nvidia.com/gpu")
    assert (device, gpus) == (("cuda", 1) if name == "gpu" else ("cpu", None))


def test_the_redis_config_map_holds_the_manifests_files_and_redis_loads_the_acl():
    docs = render(K8S / "redis")
    data = by_id(docs)["ConfigMap", "arloop-redis-config"]["data"]
    for name in ("redis.conf", "redis-acl.conf", "redis-acl.sh"):
        assert data[name] == (MANIFESTS / name).read_text(), name
    redis = by_id(docs)["StatefulSet", "arloop-redis"]["spec"]["template"]["spec"]
    (container,) = redis["containers"]
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    acl_file = f"{mounts['acl']}/users.acl"
    assert container["args"] == [
        "redis-server",
        f"{mounts['config']}/redis.conf",
        "--aclfile",
        acl_file,
    ]
    (init,) = redis["initContainers"]
    init_mounts = {m["name"]: m["mountPath"] for m in init["volumeMounts"]}
    assert init["command"] == ["sh", f"{init_mounts['config']}/redis-acl.sh"]
    assert init["args"] == [
        f"{init_mounts['config']}/redis-acl.conf",
        init_mounts["users"],
        acl_file,
    ]
    volumes = {v["name"]: v for v in redis["volumes"]}
    assert volumes["users"]["secret"]["secretName"] == "arloop-redis-users"
    assert "emptyDir" in volumes["acl"]  # hashes only, and never on the data volume
