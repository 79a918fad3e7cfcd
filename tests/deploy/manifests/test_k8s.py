"""The Kubernetes manifests: each overlay rendered, every resource valid against the Kubernetes
schemas (kubernetes-validate's strict JSON schemas, shipped in its wheel), and the wiring a
schema cannot see: the variables each process reads, ports, probes, volumes, selectors."""

from __future__ import annotations

import copy
from urllib.parse import urlparse

import kubernetes_validate
import pytest
from pydantic import ValidationError

from deploy.learn.settings import LearnerSettings
from deploy.settings import AgentApiSettings, PolicyServerSettings
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


def test_each_process_gets_only_variables_it_reads_and_its_settings_accept_them(
    overlay, monkeypatch
):
    name, docs = overlay
    seen = set()
    for workload, container in arloop_containers(docs):
        cls = settings_class(container["args"])
        seen.add(cls)
        env = container_env(docs, container)
        assert unread_variables(cls, env) == [], f"{workload['metadata']['name']} in {name}"
        if cls is AgentApiSettings and name == "gpu":
            continue  # production with the placeholder secrets: the next test
        assert build_settings(cls, env, monkeypatch).redis_url == env["ARLOOP_REDIS_URL"]
    assert seen == set(PORTS)


def test_production_refuses_the_placeholder_secrets_until_they_are_replaced(monkeypatch):
    docs = render(K8S / "overlays" / "gpu")
    (container,) = [c for _, c in arloop_containers(docs) if c["args"][-1] == "agents"]
    env = container_env(docs, container)
    assert env["ARLOOP_ENV"] == "production"
    with pytest.raises(ValidationError, match="ARLOOP_SECRET_KEY"):
        build_settings(AgentApiSettings, env, monkeypatch)
    secret = by_id(docs)["Secret", "arloop-secrets"]["stringData"]
    secret["ARLOOP_SECRET_KEY"] = "f" * 64
    with pytest.raises(ValidationError, match="ARLOOP_API_KEYS"):
        build_settings(AgentApiSettings, container_env(docs, container), monkeypatch)
    secret["ARLOOP_API_KEYS"] = '["k-0123456789abcdef"]'
    settings = build_settings(AgentApiSettings, container_env(docs, container), monkeypatch)
    assert settings.api_keys == ["k-0123456789abcdef"] and settings.secret_key == "f" * 64


def test_the_laptop_overlay_runs_in_development_with_the_development_secrets(monkeypatch):
    docs = render(K8S / "overlays" / "cpu-laptop")
    (container,) = [c for _, c in arloop_containers(docs) if c["args"][-1] == "agents"]
    settings = build_settings(AgentApiSettings, container_env(docs, container), monkeypatch)
    assert settings.env == "development" and settings.api_keys == ["dev-key"]


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


def test_the_redis_config_map_is_deploy_manifests_redis_conf():
    docs = render(K8S / "redis")
    conf = by_id(docs)["ConfigMap", "arloop-redis-config"]["data"]["redis.conf"]
    assert conf == (MANIFESTS / "redis.conf").read_text()
    redis = by_id(docs)["StatefulSet", "arloop-redis"]["spec"]["template"]["spec"]
    (container,) = redis["containers"]
    (mount,) = [m for m in container["volumeMounts"] if m["name"] == "config"]
    assert container["args"] == ["redis-server", f"{mount['mountPath']}/redis.conf"]
