"""The tests' kustomize renderer: kustomize's semantics for what it supports, an error for the
rest, and the same output as `kubectl kustomize` on our overlays where kubectl is installed."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.deploy.manifests.kustomize import KustomizeError, apply_json_patch, render
from tests.deploy.manifests.support import K8S, OVERLAYS, by_id

DEPLOYMENT = {
    "apiVersion": "apps/v1",
    "kind": "Deployment",
    "metadata": {"name": "web"},
    "spec": {
        "replicas": 2,
        "template": {
            "spec": {
                "containers": [{"name": "c", "image": "registry:5000/team/app:old", "env": []}],
                "initContainers": [{"name": "i", "image": "app"}],
            }
        },
    },
}


def _write(folder: Path, kustomization: dict, *docs: dict) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "kustomization.yaml").write_text(yaml.safe_dump(kustomization))
    if docs:
        (folder / "resources.yaml").write_text(yaml.safe_dump_all(docs))
    return folder


def _kubectl(folder: Path) -> list[dict]:
    out = subprocess.run(
        [shutil.which("kubectl"), "kustomize", str(folder)],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout
    return list(yaml.safe_load_all(out))


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_our_overlays_render_as_kubectl_kustomize_renders_them(overlay):
    if shutil.which("kubectl") is None:
        pytest.skip("kubectl is not installed: the renderer is checked by the cases below only")
    reference = by_id(_kubectl(K8S / "overlays" / overlay))
    ours = by_id(render(K8S / "overlays" / overlay))
    assert sorted(ours) == sorted(reference)
    for rid, doc in ours.items():
        assert doc == reference[rid], rid


def test_json_patch_operations_follow_rfc_6902():
    doc = {"a": {"b/c": 1, "m~n": 2}, "list": [1, 2]}
    out = apply_json_patch(
        doc,
        [
            {"op": "replace", "path": "/a/b~1c", "value": 10},
            {"op": "remove", "path": "/a/m~0n"},
            {"op": "add", "path": "/list/-", "value": 3},
            {"op": "add", "path": "/list/0", "value": 0},
            {"op": "add", "path": "/list/4", "value": 4},  # index == length appends
            {"op": "add", "path": "/new", "value": {"x": 1}},
        ],
    )
    assert out == {"a": {"b/c": 10}, "list": [0, 1, 2, 3, 4], "new": {"x": 1}}
    assert doc == {"a": {"b/c": 1, "m~n": 2}, "list": [1, 2]}  # the input is untouched


@pytest.mark.parametrize(
    "operation",
    [
        {"op": "replace", "path": "/missing", "value": 1},
        {"op": "remove", "path": "/list/5"},
        {"op": "add", "path": "/missing/deeper", "value": 1},
        {"op": "move", "path": "/list/0", "from": "/list/1"},
        {"op": "add", "path": "no-slash", "value": 1},
    ],
)
def test_a_json_patch_that_does_not_apply_is_an_error(operation):
    with pytest.raises(KustomizeError):
        apply_json_patch({"list": [1]}, [operation])


def test_patches_labels_replicas_and_images(tmp_path):
    _write(
        tmp_path / "base",
        {"resources": ["resources.yaml"], "labels": [{"pairs": {"team": "x"}}]},
        DEPLOYMENT,
    )
    overlay = _write(
        tmp_path / "overlay",
        {
            "resources": ["../base"],
            "patches": [
                {
                    "target": {"kind": "Deployment", "name": "web"},
                    "patch": "- {op: add, path: /spec/template/spec/containers/0/env/-, "
                    "value: {name: A, value: '1'}}",
                }
            ],
            "replicas": [{"name": "web", "count": 5}],
            "images": [
                {"name": "registry:5000/team/app", "newTag": "new"},
                {"name": "app", "newName": "mirror/app", "newTag": "v2"},
            ],
        },
    )
    (web,) = render(overlay)
    spec = web["spec"]["template"]["spec"]
    assert web["metadata"]["labels"] == {"team": "x"}
    assert "labels" not in web["spec"]["template"].get("metadata", {})  # includeSelectors: false
    assert web["spec"]["replicas"] == 5
    assert spec["containers"][0]["env"] == [{"name": "A", "value": "1"}]
    assert spec["containers"][0]["image"] == "registry:5000/team/app:new"
    assert spec["initContainers"][0]["image"] == "mirror/app:v2"
    if shutil.which("kubectl"):  # and exactly what kustomize itself makes of it
        assert [web] == _kubectl(overlay)


@pytest.mark.parametrize(
    "kustomization",
    [
        {"resources": ["resources.yaml"], "namePrefix": "x-"},
        {
            "resources": ["resources.yaml"],
            "labels": [{"pairs": {"a": "b"}, "includeSelectors": True}],
        },
        {"resources": ["resources.yaml"], "replicas": [{"name": "nobody", "count": 1}]},
        {"resources": ["resources.yaml", "resources.yaml"]},
        {"resources": ["missing.yaml"]},
        {
            "resources": ["resources.yaml"],
            "patches": [{"target": {"kind": "Deployment", "name": "other"}, "patch": "[]"}],
        },
        {
            "resources": ["resources.yaml"],
            "patches": [{"target": {"kind": "Deployment", "name": "web"}, "patch": "{spec: {}}"}],
        },
    ],
    ids=[
        "unsupported-field",
        "selector-labels",
        "replicas-of-nothing",
        "duplicate",
        "missing-file",
        "target-of-nothing",
        "strategic-merge",
    ],
)
def test_what_it_cannot_render_faithfully_is_refused(tmp_path, kustomization):
    with pytest.raises(KustomizeError):
        render(_write(tmp_path / "k", kustomization, DEPLOYMENT))
