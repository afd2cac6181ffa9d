"""The Kubernetes manifests: the Helm chart rendered (default and other values), the plain manifest and the
training pod's snippet, validated against the Kubernetes API's own models (the `kubernetes` client: every
field known and of its type, every required field present), and the DaemonSet checked against what
docs/kubernetes.md says the daemon needs."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from perseusd.daemon.config import DaemonConfig
from perseusd.daemon.config_loading import load_config
from tests.k8s.helm_render import (
    CHART,
    PLAIN_MANIFEST,
    REPO_ROOT,
    TemplateError,
    plain_manifest,
    render_chart,
)

kubernetes = pytest.importorskip("kubernetes", reason="the kubernetes client (pip install kubernetes)")
from kubernetes import client as k8s  # noqa: E402

MODELS = {
    ("v1", "ConfigMap"): "V1ConfigMap",
    ("v1", "Pod"): "V1Pod",
    ("apps/v1", "DaemonSet"): "V1DaemonSet",
    ("batch/v1", "Job"): "V1Job",
}
DOCS = REPO_ROOT / "docs" / "kubernetes.md"
POD_SNIPPET = REPO_ROOT / "deploy" / "kubernetes" / "training-pod.yaml"
OTHER_VALUES = {
    "monitorOnly": True,
    "powerCaps": {"enabled": False},
    "metrics": {"enabled": False},
    "runtimeClassName": "",
    "tolerations": [{"key": "gpu", "operator": "Equal", "value": "a100", "effect": "NoExecute"}],
}
POOL_VALUES = {
    "powerPool": {
        "name": "hall-a",
        "etcdEndpoints": "http://etcd-0:2379",
        "safeCapW": 1500,
        "budgetW": 24000,
    },
    "powerCaps": {"default": "3200", "nodes": {"gpu-node-7": "2400"}},
}


def _check_type(value: Any, kind: str, where: str) -> None:
    """`value` (decoded JSON) is of the client's type `kind` ("V1Container", "list[str]", ...); unknown
    fields are errors (the client's deserializer would drop them silently)."""
    if value is None:
        return
    if kind.startswith(("list[", "List[")):
        assert isinstance(value, list), f"{where}: a list expected"
        for i, item in enumerate(value):
            _check_type(item, kind[5:-1], f"{where}[{i}]")
    elif kind.startswith(("dict(", "Dict[")):  # dict(str, T) in older clients, Dict[str, T] in newer
        assert isinstance(value, dict), f"{where}: a map expected"
        inner = kind[5:-1].split(", ", 1)[1]
        for key, item in value.items():
            _check_type(item, inner, f"{where}.{key}")
    elif kind in ("str", "bytes"):
        assert isinstance(value, str), f"{where}: a string expected, got {value!r}"
    elif kind == "int":
        assert isinstance(value, int), f"{where}: an integer expected"
        assert not isinstance(value, bool), f"{where}: an integer expected"
    elif kind == "bool":
        assert isinstance(value, bool), f"{where}: a boolean expected"
    elif kind == "float":
        assert isinstance(value, int | float), f"{where}: a number expected"
        assert not isinstance(value, bool), f"{where}: a number expected"
    elif kind not in ("object", "datetime"):
        model = getattr(k8s, kind)
        assert isinstance(value, dict), f"{where}: an object ({kind}) expected"
        by_json = {json_name: attr for attr, json_name in model.attribute_map.items()}
        for key, item in value.items():
            assert key in by_json, f"{where}: {kind} has no field {key!r}"
            _check_type(item, model.openapi_types[by_json[key]], f"{where}.{key}")


def validate(document: dict[str, Any]) -> Any:
    """The document as the client's model (required fields checked by the model), or an assertion error."""
    kind = MODELS.get((document.get("apiVersion"), document.get("kind")))
    assert kind is not None, f"unexpected document {document.get('apiVersion')}/{document.get('kind')}"
    _check_type(document, kind, document["kind"])
    return k8s.ApiClient().deserialize(json.dumps(document), kind, "application/json")


def _documents(text: str) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(text) if doc]


def _daemonset(documents: list[dict[str, Any]]) -> dict[str, Any]:
    (daemonset,) = [doc for doc in documents if doc["kind"] == "DaemonSet"]
    return daemonset


def _config_of(documents: list[dict[str, Any]], tmp_path: Path) -> DaemonConfig:
    (config_map,) = [doc for doc in documents if doc["metadata"]["name"].endswith("-config")]
    path = tmp_path / "perseusd.toml"
    path.write_text(config_map["data"]["perseusd.toml"])
    return load_config(path, environ={})


@pytest.mark.parametrize("values", [{}, OTHER_VALUES, POOL_VALUES], ids=["defaults", "monitor", "pool"])
def test_the_chart_renders_valid_manifests_and_configuration(values: dict[str, Any], tmp_path: Path) -> None:
    documents = _documents(render_chart(CHART, values))
    for document in documents:
        validate(document)
    config = _config_of(documents, tmp_path)  # the daemon's own loader accepts what the chart writes
    container = _daemonset(documents)["spec"]["template"]["spec"]["containers"][0]
    added = set(container["securityContext"]["capabilities"]["add"])
    if values is OTHER_VALUES:
        assert config.monitor_only
        assert added == {"SYS_PTRACE", "CHOWN"}  # nothing to write: no SYS_ADMIN
        assert "ports" not in container
    if values is POOL_VALUES:
        assert config.power_pool == "hall-a"
        assert config.etcd_endpoints == "http://etcd-0:2379"
        (caps,) = [doc for doc in documents if doc["metadata"]["name"].endswith("-power-caps")]
        assert caps["data"] == {"default": "3200", "gpu-node-7": "2400"}
        (job,) = [doc for doc in documents if doc["kind"] == "Job"]
        command = job["spec"]["template"]["spec"]["containers"][0]["command"]
        assert command[-4:] == ["--pool", "hall-a", "--budget", "24000"]


def test_a_value_outside_the_schema_is_caught() -> None:
    documents = _documents(render_chart(CHART, {"powerCaps": {"nodes": {"gpu-node-7": 2400}}}))
    (caps,) = [doc for doc in documents if doc["metadata"]["name"].endswith("-power-caps")]
    with pytest.raises(AssertionError, match="a string expected"):
        validate(caps)
    with pytest.raises(TemplateError, match="no such value"):
        render_chart(CHART, {"metrics": None})


def test_the_plain_manifest_is_the_charts_default_rendering() -> None:
    assert PLAIN_MANIFEST.read_text() == plain_manifest(), "run `python tests/k8s/helm_render.py`"


def test_the_daemonset_gives_the_daemon_what_its_docs_say_it_needs() -> None:
    """docs/kubernetes.md's table "What the DaemonSet gives the daemon": each path mounted from the named
    source, each capability added and no other, hostPID; the paths are the daemon's defaults."""
    spec = _daemonset(_documents(PLAIN_MANIFEST.read_text()))["spec"]["template"]["spec"]
    container = spec["containers"][0]
    mounts = {mount["mountPath"]: mount["name"] for mount in container["volumeMounts"]}
    volumes = {volume["name"]: volume for volume in spec["volumes"]}
    section = DOCS.read_text().split("## What the DaemonSet gives the daemon", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| `([^`]+)` \| (\w+) \|", section, re.MULTILINE)
    assert rows, "the docs' table is missing"
    capabilities = set()
    for need, source in rows:
        if need.startswith("CAP_"):
            capabilities.add(need.removeprefix("CAP_"))
        elif need == "hostPID":
            assert spec["hostPID"] is True
        else:
            assert need in mounts, f"{need} is not mounted"
            assert source in volumes[mounts[need]], f"{need} is not a {source} volume"
            if source == "hostPath":
                assert volumes[mounts[need]]["hostPath"]["path"] == need
    assert set(container["securityContext"]["capabilities"]["add"]) == capabilities
    assert container["securityContext"]["capabilities"]["drop"] == ["ALL"]
    assert container["securityContext"]["privileged"] is False
    defaults = DaemonConfig()
    assert {str(defaults.runtime_dir), str(defaults.state_dir)} <= set(mounts)
    probe = container["readinessProbe"]["exec"]["command"]
    assert probe[:3] == ["perseusctl", "--runtime-dir", str(defaults.runtime_dir)]


def test_the_training_pod_snippet_reaches_the_sockets() -> None:
    (pod,) = _documents(POD_SNIPPET.read_text())
    validate(pod)
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert pod["spec"]["securityContext"]["runAsGroup"] == values["socketGid"]
    (volume,) = pod["spec"]["volumes"]
    assert volume["hostPath"]["path"] == values["runtimeDir"]
    (mount,) = pod["spec"]["containers"][0]["volumeMounts"]
    assert mount["mountPath"] == values["runtimeDir"]
