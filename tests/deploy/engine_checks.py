"""The checks of the engine manifests (``test_engine_manifests.py``), each a function of a
render so that a test can plant a break in a copy and see it fail: DRA claims (``check_dra``),
the warm pool (``check_warm_pool``, ``planned_warm``) and the KServe example (``check_kserve``).
"""

from __future__ import annotations

import copy
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import kubernetes_validate  # type: ignore[import-untyped]
import yaml

from sluicegate.config import Config, parse_config
from tests.deploy.test_manifests import REPO, SCHEMA_VERSIONS, _kubectl, selects

GPU = "overlays/gpu"
KSERVE = "kserve"
DRA_VERSIONS = ("1.34", "1.35")
DEVICE_CLASS = "gpu.nvidia.com"
COMPONENT = "app.kubernetes.io/component"
INSTANCE = "app.kubernetes.io/instance"
PLAN_ANNOTATION = "sluicegate.io/warm-buffer-plan"
README = REPO / "deploy" / "README.md"
# `kubectl -n NS label pod POD app.kubernetes.io/component=VALUE --overwrite` in deploy/README.md.
LABEL_SWITCH = re.compile(
    r"kubectl -n (\S+) label pod \S+ (app\.kubernetes\.io/component)=(\S+) --overwrite"
)
# KServe's ComponentExtensionSpec (kserve pkg/apis/serving/v1beta1/component.go, 0.11 to 0.15):
# the predictor's fields besides its model and the PodSpec it inlines.
KSERVE_EXTENSION = {
    "minReplicas", "maxReplicas", "scaleTarget", "scaleMetric", "scaleMetricType",
    "containerConcurrency", "timeout", "canaryTrafficPercent", "logger", "batcher", "labels",
    "annotations", "deploymentStrategy", "autoScaling", "workerSpec",
}  # fmt: skip
# ModelSpec (kserve pkg/apis/serving/v1beta1/predictor_model.go): these, then a corev1.Container.
KSERVE_MODEL = {
    "modelFormat",
    "runtime",
    "storageUri",
    "storage",
    "runtimeVersion",
    "protocolVersion",
}
KSERVE_SPEC = {"predictor", "transformer", "explainer"}

Rendered = tuple[dict[str, Any], ...]


def render_tree(root: Path, directory: str) -> Rendered:
    """``kubectl kustomize ROOT/DIRECTORY`` (a copy of deploy/k8s with a planted break)."""
    result = subprocess.run(
        [_kubectl(), "kustomize", str(root / directory)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, f"kubectl kustomize {directory}: {result.stderr}"
    return tuple(doc for doc in yaml.safe_load_all(result.stdout) if doc)


def kinds(rendered: Rendered, kind: str) -> list[dict[str, Any]]:
    """The objects of ``kind`` in a render."""
    return [obj for obj in rendered if obj["kind"] == kind]


def named(rendered: Rendered, kind: str, name: str) -> dict[str, Any]:
    """The one object of ``kind`` called ``name``."""
    (found,) = [obj for obj in kinds(rendered, kind) if obj["metadata"]["name"] == name]
    return found


def engines(rendered: Rendered) -> list[dict[str, Any]]:
    """Every Deployment but the gateway's."""
    return [d for d in kinds(rendered, "Deployment") if d["metadata"]["name"] != "sluicegate"]


def pod_labels(workload: dict[str, Any]) -> dict[str, str]:
    """The labels of a workload's pod template."""
    return dict(workload["spec"]["template"]["metadata"]["labels"])


def flag(args: list[str], name: str) -> str | None:
    """The value after ``name`` in an argument list (or of ``name=value``), None if absent."""
    for index, arg in enumerate(args):
        if arg == name:
            return args[index + 1]
        if arg.startswith(name + "="):
            return arg.split("=", 1)[1]
    return None


def config_of(rendered: Rendered) -> Config:
    """The gateway config of a render, parsed by sluicegate's loader."""
    volumes = named(rendered, "Deployment", "sluicegate")["spec"]["template"]["spec"]["volumes"]
    name = next(v["configMap"]["name"] for v in volumes if "configMap" in v)
    text = named(rendered, "ConfigMap", name)["data"]["sluicegate.yaml"]
    return parse_config(text, source=f"ConfigMap {name}")


def label_switches() -> list[tuple[str, str, str]]:
    """(namespace, label, value) of each ``kubectl label pod`` command in deploy/README.md."""
    return [(m[1], m[2], m[3]) for m in LABEL_SWITCH.finditer(README.read_text())]


# --- the checks, each a function of a render ------------------------------------------------


def check_dra(rendered: Rendered) -> int:
    """Each engine pod claims its GPUs only through DRA: every ``spec.resourceClaims`` entry
    names a ResourceClaimTemplate (resource.k8s.io/v1) of the render in its namespace and is
    used by a container's ``resources.claims`` (and no container names another); no container
    also asks for the device plugin's ``nvidia.com/gpu``; every request is ``exactly`` devices
    of class gpu.nvidia.com, ExactCount, whose count adds up to vLLM's --tensor-parallel-size,
    and a CEL selector reads the driver's memory capacity. Returns the engines checked."""
    templates = {
        (t["metadata"]["namespace"], t["metadata"]["name"]): t
        for t in kinds(rendered, "ResourceClaimTemplate")
    }
    checked = 0
    for engine in engines(rendered):
        where = engine["metadata"]["name"]
        pod = engine["spec"]["template"]["spec"]
        claims = {claim["name"]: claim for claim in pod.get("resourceClaims", [])}
        assert claims, f"{where}: no resourceClaims"
        used: set[str] = set()
        for container in pod["containers"]:
            resources = container["resources"]
            for part in ("requests", "limits"):
                assert "nvidia.com/gpu" not in resources.get(part, {}), f"{where}: device plugin"
            names = {claim["name"] for claim in resources.get("claims", [])}
            assert names <= set(claims), f"{where}: {names - set(claims)} is no pod claim"
            used |= names
        assert used == set(claims), f"{where}: {set(claims) - used} claimed but not used"
        (container,) = pod["containers"]
        parallel = int(flag(container["args"], "--tensor-parallel-size") or 1)
        for claim in claims.values():
            key = (engine["metadata"]["namespace"], claim["resourceClaimTemplateName"])
            assert key in templates, f"{where}: no ResourceClaimTemplate {key}"
            template = templates[key]
            assert template["apiVersion"] == "resource.k8s.io/v1"
            devices = 0
            for request in template["spec"]["spec"]["devices"]["requests"]:
                exactly = request["exactly"]
                assert exactly["deviceClassName"] == DEVICE_CLASS, exactly
                assert exactly.get("allocationMode", "ExactCount") == "ExactCount", exactly
                devices += exactly.get("count", 1)
                expressions = [s["cel"]["expression"] for s in exactly.get("selectors", [])]
                assert any(f"device.capacity['{DEVICE_CLASS}'].memory" in e for e in expressions), (
                    expressions
                )
            assert devices == parallel, f"{where}: {devices} GPUs for tensor parallel {parallel}"
        checked += 1
    return checked


def check_warm_pool(rendered: Rendered, switches: list[tuple[str, str, str]]) -> int:
    """Each warm Deployment (named ``*-warm``; there is one at least) keeps its pods out of the
    serving Service of their model, and the README's label switch (component=engine) puts one
    in; the switched pod leaves the pool's selector (its ReplicaSet lets it go and replaces
    it) and the switch back (component=engine-warm) returns it. The pool's pod template is
    the serving engine's but for that label, the selectors of pool and engine are disjoint,
    no ScaledObject targets the pool and one targets the engine. Returns the pools checked."""
    assert switches, "deploy/README.md has no `kubectl label pod` command"
    values = {value for _, _, value in switches}
    assert values == {"engine", "engine-warm"}, values
    scaled = {s["spec"]["scaleTargetRef"]["name"] for s in kinds(rendered, "ScaledObject")}
    pools = [d for d in engines(rendered) if d["metadata"]["name"].endswith("-warm")]
    assert pools, "no warm pool (a Deployment named *-warm)"
    for pool in pools:
        where = pool["metadata"]["name"]
        labels = pod_labels(pool)
        assert labels.get(COMPONENT) == "engine-warm", f"{where}: {labels}"
        namespace = pool["metadata"]["namespace"]
        assert {ns for ns, _, _ in switches} == {namespace}, "README commands: another namespace"
        (label,) = {key for _, key, _ in switches}
        serving = [
            d
            for d in engines(rendered)
            if pod_labels(d).get(INSTANCE) == labels[INSTANCE] and d is not pool
        ]
        assert len(serving) == 1, f"{where}: {len(serving)} serving Deployments"
        engine = serving[0]
        services = [
            s
            for s in kinds(rendered, "Service")
            if s["spec"]["selector"].get(INSTANCE) == labels[INSTANCE]
        ]
        assert len(services) == 1, f"{where}: {len(services)} Services of its model"
        selector = services[0]["spec"]["selector"]
        assert not selects(selector, labels), f"{where}: a warm pod takes traffic"
        assert selects(selector, pod_labels(engine)), f"{where}: the Service skips the engine"
        promoted = {**labels, label: "engine"}
        assert selects(selector, promoted), f"{where}: a promoted pod takes no traffic"
        pool_selector = pool["spec"]["selector"]["matchLabels"]
        assert selects(pool_selector, labels)
        assert not selects(pool_selector, promoted), f"{where}: the pool keeps a promoted pod"
        assert selects(pool_selector, {**promoted, label: "engine-warm"})
        engine_selector = engine["spec"]["selector"]["matchLabels"]
        assert not selects(pool_selector, pod_labels(engine)), f"{where}: selectors overlap"
        assert not selects(engine_selector, labels), f"{where}: selectors overlap"
        same = copy.deepcopy(pool["spec"]["template"])
        same["metadata"]["labels"][label] = pod_labels(engine)[label]
        assert same == engine["spec"]["template"], f"{where}: not the serving engine's pod"
        assert where not in scaled, f"{where}: an autoscaler would size the pool"
        assert engine["metadata"]["name"] in scaled
        assert pool["spec"]["replicas"] >= 1
    return len(pools)


def planned_pools(rendered: Rendered) -> list[dict[str, Any]]:
    """The Deployments whose annotation names the ``sluicegate plan`` run that sizes them."""
    return [d for d in engines(rendered) if PLAN_ANNOTATION in d["metadata"].get("annotations", {})]


def planned_warm(command: str, out: Path) -> int:
    """The "recommended warm" figure ``sluicegate plan`` prints for ``command``."""
    args = shlex.split(command)
    assert args[:2] == ["sluicegate", "plan"], command
    result = subprocess.run(
        [sys.executable, "-m", "sluicegate", *args[1:], "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={**os.environ, "COLUMNS": "200"},
    )
    assert result.returncode == 0, result.stderr
    found = re.search(r"recommended warm\s*│\s*(\d+)", result.stdout)
    assert found is not None, result.stdout
    return int(found.group(1))


def check_kserve(rendered: Rendered) -> None:
    """The InferenceService runs KServe's Hugging Face runtime (modelFormat huggingface) with
    the vLLM backend as a RawDeployment, under the gateway's model name, on GPUs requested
    equal to their limit; its fields are KServe's and the pod and container parts it inlines
    validate against the Pod schema. The gateway has one backend, engine vllm, whose URL is
    the predictor's Service ``<name>-predictor.<namespace>.svc.cluster.local`` plus the
    runtime's /openai route prefix; the render holds no engine Service of its own."""
    (isvc,) = kinds(rendered, "InferenceService")
    assert isvc["apiVersion"] == "serving.kserve.io/v1beta1"
    spec = isvc["spec"]
    assert set(spec) <= KSERVE_SPEC, set(spec) - KSERVE_SPEC
    annotations = isvc["metadata"].get("annotations", {})
    assert annotations.get("serving.kserve.io/deploymentMode") == "RawDeployment"
    predictor = spec["predictor"]
    model = predictor["model"]
    assert model["modelFormat"]["name"] == "huggingface"
    container = {key: value for key, value in model.items() if key not in KSERVE_MODEL}
    pod_spec = {
        key: value
        for key, value in predictor.items()
        if key not in KSERVE_EXTENSION and key != "model"
    }
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "predictor"},
        "spec": {**pod_spec, "containers": [{"name": "kserve-container", **container}]},
    }
    for version in SCHEMA_VERSIONS:
        kubernetes_validate.validate(pod, version, strict=True)
    args = model["args"]
    assert flag(args, "--backend") == "vllm"
    assert flag(args, "--model_id")
    gpus = {part: model["resources"][part].get("nvidia.com/gpu") for part in ("requests", "limits")}
    assert gpus["requests"] == gpus["limits"] is not None, gpus
    config = config_of(rendered)
    (served,) = config.models
    assert flag(args, "--model_name") == served.name
    (backend,) = served.backends
    assert backend.engine == "vllm"
    assert backend.url is not None
    url = urlsplit(backend.url)
    name, namespace = isvc["metadata"]["name"], isvc["metadata"]["namespace"]
    assert url.hostname == f"{name}-predictor.{namespace}.svc.cluster.local", backend.url
    assert url.port in (None, 80), "KServe's predictor Service listens on port 80"
    prefix = next(
        (e["value"] for e in model.get("env", []) if e["name"] == "KSERVE_OPENAI_ROUTE_PREFIX"),
        "openai",
    )
    assert url.path.rstrip("/") == (f"/{prefix}" if prefix else ""), backend.url
    assert [s["metadata"]["name"] for s in kinds(rendered, "Service")] == ["sluicegate"]
