"""What the manifest tests share: paths, which settings class reads a command's variables,
and a container's environment as Kubernetes would hand it to the process."""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

from pydantic import BaseModel
from pydantic_settings import BaseSettings

from deploy.learn.settings import LearnerSettings
from deploy.policy_server.settings import PolicyServerSettings
from deploy.settings import PREFIX, AgentApiSettings

ROOT = Path(__file__).resolve().parents[3]
MANIFESTS = ROOT / "deploy" / "manifests"
K8S = MANIFESTS / "k8s"
OVERLAYS = ("cpu-laptop", "gpu")

# The process an `arloop ...` command starts, by the settings class it reads.
COMMANDS: dict[tuple[str, ...], type[BaseSettings]] = {
    ("arloop", "serve", "agents"): AgentApiSettings,
    ("arloop", "serve", "policy"): PolicyServerSettings,
    ("arloop", "learn"): LearnerSettings,
}


def settings_class(command: list[str]) -> type[BaseSettings]:
    """The settings class of the process a container's command starts."""
    try:
        return COMMANDS[tuple(command)]
    except KeyError:
        raise AssertionError(f"{command} is not an arloop process command") from None


def variables(cls: type[BaseModel], name: str, prefix: str = PREFIX) -> list[str]:
    """The variables that set field `name`, the one to use first: ARLOOP_AGENTS_PORT (then the
    shared ARLOOP_PORT) for the agent API's `port`, ARLOOP_DATA_DIR for `data_dir`."""
    choices = getattr(cls.model_fields[name].validation_alias, "choices", None)
    return [c.upper() for c in choices] if choices else [f"{prefix}{name}".upper()]


def setting_names(cls: type[BaseModel], prefix: str = PREFIX) -> set[str]:
    """Every variable that sets a field of `cls`: ARLOOP_AGENTS_PORT, ARLOOP_TRAIN__LEARNING_RATE..."""
    names = set()
    for name, field in cls.model_fields.items():
        var = f"{prefix}{name}".upper()
        names |= set(variables(cls, name, prefix))
        if isinstance(field.annotation, type) and issubclass(field.annotation, BaseModel):
            names |= setting_names(field.annotation, var + "__")
    return names


def unread_variables(cls: type[BaseSettings], env: dict[str, str]) -> list[str]:
    """The ARLOOP_* names in `env` that the process does not read (a typo, another process's)."""
    known = setting_names(cls) - set(getattr(cls, "renamed", {}))
    return sorted(v for v in env if v.startswith(PREFIX) and v not in known)


def build_settings(cls: type[BaseSettings], env: dict[str, str], monkeypatch) -> BaseSettings:
    """The process's settings from exactly `env` (nothing of this machine's ARLOOP_*, no .env)."""
    for name in list(os.environ):
        if name.startswith(PREFIX):
            monkeypatch.delenv(name)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return cls(_env_file=None)


# -- Kubernetes ----------------------------------------------------------------------------


def by_id(docs: list[dict]) -> dict[tuple[str, str], dict]:
    return {(d["kind"], d["metadata"]["name"]): d for d in docs}


def workloads(docs: list[dict]) -> list[dict]:
    return [d for d in docs if d["kind"] in ("Deployment", "StatefulSet")]


def arloop_containers(docs: list[dict]) -> list[tuple[dict, dict]]:
    """(workload, container) for every container that runs an arloop process."""
    return [
        (w, c)
        for w in workloads(docs)
        for c in w["spec"]["template"]["spec"]["containers"]
        if c.get("args", [""])[0] == "arloop"
    ]


def container_env(docs: list[dict], container: dict) -> dict[str, str]:
    """The environment the container gets: envFrom (in order), then env, references resolved."""
    objects = by_id(docs)
    env: dict[str, str] = {}
    for source in container.get("envFrom", []):
        if "configMapRef" in source:
            env.update(objects["ConfigMap", source["configMapRef"]["name"]]["data"])
        else:
            env.update(_secret_data(objects["Secret", source["secretRef"]["name"]]))
    for var in container.get("env", []):
        env[var["name"]] = _value(objects, container, var)
    return env


def _value(objects: dict, container: dict, var: dict[str, Any]) -> str:
    if "value" in var:
        return var["value"]
    ref = var["valueFrom"]
    if "configMapKeyRef" in ref:
        key = ref["configMapKeyRef"]
        return objects["ConfigMap", key["name"]]["data"][key["key"]]
    if "secretKeyRef" in ref:
        key = ref["secretKeyRef"]
        return _secret_data(objects["Secret", key["name"]])[key["key"]]
    if "resourceFieldRef" in ref:
        field = ref["resourceFieldRef"]
        kind, resource = field["resource"].split(".")
        quantity = container["resources"][kind][resource]
        return str(math.ceil(cpu_cores(quantity) / cpu_cores(field.get("divisor", "1"))))
    raise AssertionError(f"unexpected env source {ref}")


def _secret_data(secret: dict) -> dict[str, str]:
    assert "data" not in secret, "write secrets as stringData in the manifests"
    return secret["stringData"]


def cpu_cores(quantity: str | int | float) -> float:
    """A Kubernetes CPU quantity in cores: "500m" -> 0.5, "2" -> 2."""
    text = str(quantity)
    return int(text[:-1]) / 1000 if text.endswith("m") else float(text)
