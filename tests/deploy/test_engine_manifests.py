"""The engine manifests: vLLM on GPUs claimed through DRA, the warm pool, the KServe example.

``overlays/gpu`` (components engine-vllm and engine-warm-pool) and ``kserve`` are rendered with
the real ``kubectl kustomize`` like the other overlays (``test_manifests.py``, whose helpers this
file imports). Core kinds validate strictly against ``kubernetes-validate``'s schemas; the DRA
objects (``resource.k8s.io/v1``) exist from Kubernetes 1.34, so the GPU overlay is validated
against 1.34 and 1.35 rather than ``SCHEMA_VERSIONS``. The InferenceService is a custom
resource: its fields are checked like the other CRDs, and the Kubernetes parts it embeds (the
predictor's pod spec, the model's container) against the Pod schema. Every check is a function
of a render, so the tests at the end plant a break in a copy and see it fail.
"""

from __future__ import annotations

import copy
import os
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import kubernetes_validate  # type: ignore[import-untyped]
import pytest
import yaml

from sluicegate.config import Config, parse_config
from tests.deploy.test_manifests import (
    CRD_GROUPS,
    K8S,
    REPO,
    SCHEMA_VERSIONS,
    _kubectl,
    render,
    selects,
)

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


# --- DRA ------------------------------------------------------------------------------------


@pytest.mark.parametrize("version", DRA_VERSIONS)
def test_gpu_overlay_validates_strictly_from_kubernetes_1_34(version: str) -> None:
    """Every core object of overlays/gpu, the ResourceClaimTemplates and the Deployments that
    claim them included, validates strictly against the schema of Kubernetes 1.34 and 1.35;
    every namespaced object has a namespace."""
    checked = set()
    for obj in render(GPU):
        if obj["kind"] not in {"Namespace"}:
            assert obj["metadata"].get("namespace"), obj["metadata"]["name"]
        if obj["apiVersion"].split("/")[0] in CRD_GROUPS:
            continue
        try:
            kubernetes_validate.validate(obj, version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            pytest.fail(f"{GPU}: {obj['kind']} {obj['metadata']['name']}: {exc}")
        checked.add(obj["kind"])
    assert {"ResourceClaimTemplate", "Deployment", "Service"} <= checked


def test_dra_needs_kubernetes_1_34() -> None:
    """Kubernetes 1.33 has no resource.k8s.io/v1 (DRA went GA in 1.34): its schemas have none
    for the ResourceClaimTemplates, which is why this overlay is not in SCHEMA_VERSIONS' runs."""
    templates = kinds(render(GPU), "ResourceClaimTemplate")
    assert len(templates) == 2
    for template in templates:
        with pytest.raises(kubernetes_validate.SchemaNotFoundError):
            kubernetes_validate.validate(template, "1.33", strict=True)


def test_v1beta1_request_layout_fails_the_v1_schema() -> None:
    """A request written the v1beta1 way (deviceClassName on the request, not under
    ``exactly``) is refused by the strict 1.34 schema: the schema check sees the layout."""
    template = copy.deepcopy(kinds(render(GPU), "ResourceClaimTemplate")[0])
    (request,) = template["spec"]["spec"]["devices"]["requests"]
    request.update(request.pop("exactly"))
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(template, "1.34", strict=True)


def test_engine_pods_claim_their_gpus_through_dra() -> None:
    """Every engine Deployment of overlays/gpu (both models' and the warm pool) passes
    ``check_dra``."""
    assert check_dra(render(GPU)) == 3  # the two engines and the warm pool


def test_gpu_overlay_config_names_the_vllm_engines() -> None:
    """The gateway's config parses; each backend's Service selects the pods of one vLLM
    engine Deployment (and not its warm pool's), serving that model's name on that port; the
    engine-autoscaling ScaledObjects target exactly those Deployments."""
    rendered = render(GPU)
    config = config_of(rendered)
    targets = sorted(s["spec"]["scaleTargetRef"]["name"] for s in kinds(rendered, "ScaledObject"))
    served = []
    for model in config.models:
        (backend,) = model.backends
        assert backend.engine == "vllm"
        assert backend.url is not None
        url = urlsplit(backend.url)
        service = named(rendered, "Service", url.hostname or "")
        chosen = [
            d for d in engines(rendered) if selects(service["spec"]["selector"], pod_labels(d))
        ]
        assert len(chosen) == 1, f"{model.name}: {len(chosen)} Deployments behind its Service"
        (container,) = chosen[0]["spec"]["template"]["spec"]["containers"]
        assert container["command"] == ["vllm", "serve"]
        assert flag(container["args"], "--served-model-name") == model.name
        assert int(flag(container["args"], "--port") or 0) == container["ports"][0]["containerPort"]
        assert url.port in {p["port"] for p in service["spec"]["ports"]}
        served.append(chosen[0]["metadata"]["name"])
    assert sorted(served) == targets


# --- the warm pool --------------------------------------------------------------------------


def test_warm_pool_is_out_of_the_service_until_promoted() -> None:
    """overlays/gpu has one warm pool, and it passes ``check_warm_pool`` with the README's
    label switches."""
    assert check_warm_pool(render(GPU), label_switches()) == 1


def test_warm_pool_size_is_the_planners_figure(tmp_path: Path) -> None:
    """The pool's replicas are the "recommended warm" figure of the ``sluicegate plan`` run its
    annotation names, and deploy/README.md shows that same command."""
    (pool,) = planned_pools(render(GPU))
    command = " ".join(pool["metadata"]["annotations"][PLAN_ANNOTATION].split())
    assert pool["spec"]["replicas"] == planned_warm(command, tmp_path)
    assert command in " ".join(README.read_text().split())


# --- KServe ---------------------------------------------------------------------------------


@pytest.mark.parametrize("version", SCHEMA_VERSIONS)
def test_kserve_example_renders_and_its_core_kinds_validate(version: str) -> None:
    """deploy/k8s/kserve renders; its core objects (the gateway's) validate strictly; every
    namespaced object has a namespace."""
    rendered = render(KSERVE)
    for obj in rendered:
        if obj["kind"] != "Namespace":
            assert obj["metadata"].get("namespace"), obj["metadata"]["name"]
        if obj["apiVersion"].startswith("serving.kserve.io/"):
            continue
        kubernetes_validate.validate(obj, version, strict=True)
    assert {obj["kind"] for obj in rendered} >= {"Deployment", "ConfigMap", "InferenceService"}


def test_kserve_inference_service_and_the_gateway_in_front() -> None:
    """deploy/k8s/kserve passes ``check_kserve``."""
    check_kserve(render(KSERVE))


# --- every check fails on a planted break ---------------------------------------------------


def _engine(rendered: Rendered, name: str = "engine-llama-3-1-8b") -> dict[str, Any]:
    return named(rendered, "Deployment", name)


def _container(rendered: Rendered, name: str = "engine-llama-3-1-8b") -> dict[str, Any]:
    container: dict[str, Any] = _engine(rendered, name)["spec"]["template"]["spec"]["containers"][0]
    return container


def _claims(rendered: Rendered) -> list[dict[str, Any]]:
    claims: list[dict[str, Any]] = _engine(rendered)["spec"]["template"]["spec"]["resourceClaims"]
    return claims


def _request(rendered: Rendered, template: str) -> dict[str, Any]:
    spec = named(rendered, "ResourceClaimTemplate", template)["spec"]["spec"]
    exactly: dict[str, Any] = spec["devices"]["requests"][0]["exactly"]
    return exactly


DRA_BREAKS: dict[str, tuple[str, Callable[[Rendered], None]]] = {
    "claim not used": ("claimed but not used", lambda r: _container(r)["resources"].pop("claims")),
    "template typo": (
        "no ResourceClaimTemplate",
        lambda r: _claims(r)[0].update(resourceClaimTemplateName="gpu-llama-3-1-8"),
    ),
    "device plugin too": (
        "device plugin",
        lambda r: _container(r)["resources"]["limits"].update({"nvidia.com/gpu": "1"}),
    ),
    "count below tensor parallel": (
        "2 GPUs for tensor parallel 4",
        lambda r: _request(r, "gpu-llama-3-1-70b").update(count=2),
    ),
    "other class": (
        "gpu.example.com",
        lambda r: _request(r, "gpu-llama-3-1-8b").update(deviceClassName="gpu.example.com"),
    ),
    "no memory selector": (
        "\\[\\]",
        lambda r: _request(r, "gpu-llama-3-1-8b").update(selectors=[]),
    ),
}


@pytest.mark.parametrize("name", sorted(DRA_BREAKS))
def test_dra_check_fails_on_a_planted_break(name: str) -> None:
    """``check_dra`` fails on a copy of the render with one break planted."""
    message, plant = DRA_BREAKS[name]
    rendered = copy.deepcopy(render(GPU))
    plant(rendered)
    with pytest.raises(AssertionError, match=message):
        check_dra(rendered)


def test_warm_pool_check_fails_when_the_pool_serves(tmp_path: Path) -> None:
    """In a copy of deploy/k8s whose warm pool is labelled component: engine, or whose engine
    Service selects by instance alone (the pool's pods in the Service), ``check_warm_pool``
    fails; with a pool template that differs from the engine's
    (another image) it fails too; without the README's commands it fails."""
    root = tmp_path / "k8s"
    shutil.copytree(K8S, root)
    warm = root / "components" / "engine-warm-pool" / "engine-llama-3-1-8b-warm.yaml"
    text = warm.read_text()
    warm.write_text(text.replace("component: engine-warm", "component: engine"))
    with pytest.raises(AssertionError, match="-warm: "):
        check_warm_pool(render_tree(root, GPU), label_switches())
    warm.write_text(text)
    services = root / "base" / "engine-services.yaml"
    kept = services.read_text()
    loose = kept.replace("  selector:\n    app.kubernetes.io/component: engine\n", "  selector:\n")
    assert loose != kept
    services.write_text(loose)
    with pytest.raises(AssertionError, match="a warm pod takes traffic"):
        check_warm_pool(render_tree(root, GPU), label_switches())
    services.write_text(kept)
    warm.write_text(text.replace("vllm/vllm-openai:v0.11.0", "vllm/vllm-openai:v0.10.2"))
    with pytest.raises(AssertionError, match="not the serving engine's pod"):
        check_warm_pool(render_tree(root, GPU), label_switches())
    with pytest.raises(AssertionError, match="no `kubectl label pod`"):
        check_warm_pool(render(GPU), [])


def test_warm_pool_size_check_fails_on_another_figure(tmp_path: Path) -> None:
    """A plan with a smaller burst gives another figure than the pool's replicas."""
    (pool,) = planned_pools(render(GPU))
    command = pool["metadata"]["annotations"][PLAN_ANNOTATION].replace(
        "--burst-factor 2", "--burst-factor 1"
    )
    assert "--burst-factor 1" in command
    assert planned_warm(command, tmp_path) != pool["spec"]["replicas"]


KSERVE_BREAKS: dict[str, Callable[[Rendered], None]] = {
    "predictor host": lambda r: named(r, "InferenceService", "llama-3-1-8b")["metadata"].update(
        name="llama-8b"
    ),
    "model name": lambda r: named(r, "InferenceService", "llama-3-1-8b")["spec"]["predictor"][
        "model"
    ]["args"].__setitem__(0, "--model_name=llama3"),
    "unknown container field": lambda r: named(r, "InferenceService", "llama-3-1-8b")["spec"][
        "predictor"
    ]["model"].update(resource={}),
    "route prefix": lambda r: named(r, "InferenceService", "llama-3-1-8b")["spec"]["predictor"][
        "model"
    ]["env"].append({"name": "KSERVE_OPENAI_ROUTE_PREFIX", "value": ""}),
}


@pytest.mark.parametrize("name", sorted(KSERVE_BREAKS))
def test_kserve_check_fails_on_a_planted_break(name: str) -> None:
    """``check_kserve`` fails on a copy of the render with one break planted."""
    rendered = copy.deepcopy(render(KSERVE))
    KSERVE_BREAKS[name](rendered)
    with pytest.raises((AssertionError, kubernetes_validate.ValidationError)):
        check_kserve(rendered)
