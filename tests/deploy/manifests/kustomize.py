"""A small kustomize for the tests: renders deploy/manifests/k8s overlays without a binary.

No kustomize installs from the registries reachable here for Python 3.11 (PyPI's `kustomize`
is an unrelated generator, `pykustomize` needs Python 3.14; Debian and npm have none), so the
tests render the overlays with this. It implements only what our kustomizations use, with
kustomize's semantics, and refuses anything else rather than ignore it: `resources` (files and
folders with a kustomization), `labels` (metadata only: `includeSelectors: false`),
`patches` (JSON 6902 operations, `target` by kind and name), `replicas` and `images`,
applied in kustomize's order (patches, labels, replicas, images). Where `kubectl` is on PATH,
`test_kustomize.py` checks the output against `kubectl kustomize`.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml

KUSTOMIZATION_FILES = ("kustomization.yaml", "kustomization.yml", "Kustomization")
SUPPORTED = {"apiVersion", "kind", "resources", "labels", "patches", "replicas", "images"}
SCALABLE = {"Deployment", "StatefulSet", "ReplicaSet", "ReplicationController"}

Doc = dict[str, Any]


class KustomizeError(ValueError):
    """A kustomization this renderer cannot render (or kustomize would refuse)."""


def render(folder: Path) -> list[Doc]:
    """The resources a kustomization folder renders to, in the order they were listed."""
    folder = Path(folder)
    spec = _kustomization(folder)
    unknown = set(spec) - SUPPORTED
    if unknown:
        raise KustomizeError(f"{folder}: fields this renderer does not support: {sorted(unknown)}")
    docs: list[Doc] = []
    for entry in spec.get("resources", []):
        docs += _load(folder / entry)
    _check_unique(docs, folder)
    for patch in spec.get("patches", []):
        _patch(docs, patch, folder)
    for labels in spec.get("labels", []):
        _label(docs, labels)
    for replicas in spec.get("replicas", []):
        _scale(docs, replicas)
    for image in spec.get("images", []):
        _retag(docs, image)
    return docs


def resource_id(doc: Doc) -> tuple[str, str]:
    """(kind, name): what kustomize keys a resource by within one namespace."""
    return doc["kind"], doc["metadata"]["name"]


def _kustomization(folder: Path) -> Doc:
    for name in KUSTOMIZATION_FILES:
        if (folder / name).is_file():
            return yaml.safe_load((folder / name).read_text()) or {}
    raise KustomizeError(f"{folder}: no kustomization.yaml")


def _load(path: Path) -> list[Doc]:
    if path.is_dir():
        return render(path)
    if not path.is_file():
        raise KustomizeError(f"resource {path} does not exist")
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def _check_unique(docs: list[Doc], folder: Path) -> None:
    seen: set[tuple[str, str]] = set()
    for doc in docs:
        rid = resource_id(doc)
        if rid in seen:
            raise KustomizeError(f"{folder}: {rid[0]}/{rid[1]} is defined twice")
        seen.add(rid)


def _patch(docs: list[Doc], patch: Doc, folder: Path) -> None:
    if set(patch) - {"target", "patch", "path"} or ("patch" in patch) == ("path" in patch):
        raise KustomizeError(f"a patch needs a target and one of patch or path, got {patch}")
    target = patch.get("target") or {}
    if set(target) != {"kind", "name"}:
        raise KustomizeError(f"a patch target needs exactly kind and name, got {target}")
    text = patch["patch"] if "patch" in patch else (folder / patch["path"]).read_text()
    operations = yaml.safe_load(text)
    if not isinstance(operations, list):
        raise KustomizeError("only JSON 6902 patches (a list of operations) are supported")
    wanted = (target["kind"], target["name"])
    hits = [i for i, doc in enumerate(docs) if resource_id(doc) == wanted]
    if not hits:
        raise KustomizeError(f"patch target {wanted[0]}/{wanted[1]} matches nothing")
    for i in hits:
        docs[i] = apply_json_patch(docs[i], operations)


def apply_json_patch(doc: Doc, operations: list[Doc]) -> Doc:
    """RFC 6902 `add`, `replace`, `remove` on a copy of `doc`; a bad path is an error."""
    doc = copy.deepcopy(doc)
    for op in operations:
        *parents, last = _pointer(op["path"])
        parent = doc
        for token in parents:
            parent = parent[_index(parent, token)]
        kind = op["op"]
        if kind == "add" and isinstance(parent, list):
            at = len(parent) if last == "-" else _index(parent + [None], last)
            parent.insert(at, copy.deepcopy(op["value"]))
        elif kind == "add":
            parent[last] = copy.deepcopy(op["value"])
        elif kind in ("replace", "remove"):
            key = _index(parent, last)
            if kind == "replace":
                parent[key] = copy.deepcopy(op["value"])
            else:
                del parent[key]
        else:
            raise KustomizeError(f"unsupported JSON patch operation {kind!r}")
    return doc


def _pointer(path: str) -> list[str]:
    if not path.startswith("/"):
        raise KustomizeError(f"JSON pointer {path!r} must start with /")
    return [t.replace("~1", "/").replace("~0", "~") for t in path[1:].split("/")]


def _index(parent: Any, token: str) -> Any:
    """The key or list index `token` names in `parent`; KustomizeError if it is not there."""
    if isinstance(parent, list):
        if not token.isdigit() or int(token) >= len(parent):
            raise KustomizeError(f"no list index {token!r} (length {len(parent)})")
        return int(token)
    if not isinstance(parent, dict) or token not in parent:
        raise KustomizeError(f"no key {token!r} to patch")
    return token


def _label(docs: list[Doc], labels: Doc) -> None:
    if labels.get("includeSelectors", False) or labels.get("includeTemplates", False):
        raise KustomizeError("only labels with includeSelectors: false are supported")
    for doc in docs:
        doc["metadata"].setdefault("labels", {}).update(labels["pairs"])


def _scale(docs: list[Doc], replicas: Doc) -> None:
    found = [d for d in docs if d["metadata"]["name"] == replicas["name"] and d["kind"] in SCALABLE]
    if not found:
        raise KustomizeError(f"replicas: no workload named {replicas['name']}")
    for doc in found:
        doc["spec"]["replicas"] = replicas["count"]


def _retag(docs: list[Doc], image: Doc) -> None:
    for container in (c for d in docs for c in _containers(d)):
        name, tag = _split_image(container["image"])
        if name != image["name"]:
            continue
        new_tag = image.get("newTag", tag)
        container["image"] = image.get("newName", name) + (f":{new_tag}" if new_tag else "")


def _split_image(image: str) -> tuple[str, str | None]:
    """("registry:5000/team/arloop", "cpu") from an image reference; no digests here."""
    if "@" in image:
        raise KustomizeError(f"image digests are not supported: {image}")
    head, _, last = image.rpartition("/")
    if ":" in last:
        last, tag = last.split(":", 1)
        return (f"{head}/{last}" if head else last), tag
    return image, None


def _containers(node: Any) -> list[Doc]:
    """Every container and init container anywhere in a resource."""
    found: list[Doc] = []
    if isinstance(node, dict):
        for key, value in node.items():
            if key in ("containers", "initContainers") and isinstance(value, list):
                found += [c for c in value if isinstance(c, dict) and "image" in c]
            else:
                found += _containers(value)
    elif isinstance(node, list):
        for item in node:
            found += _containers(item)
    return found
