"""The engine manifests: vLLM on GPUs claimed through DRA, the warm pool, the KServe example.

``overlays/gpu`` (components engine-vllm and engine-warm-pool) and ``kserve`` are rendered with
the real ``kubectl kustomize`` like the other overlays (``test_manifests.py``, whose helpers
these tests import). Core kinds validate strictly against ``kubernetes-validate``'s schemas; the
DRA objects (``resource.k8s.io/v1``) exist from Kubernetes 1.34, so the GPU overlay is validated
against 1.34 and 1.35 rather than ``SCHEMA_VERSIONS``. The InferenceService is a custom
resource: its fields are checked like the other CRDs, and the Kubernetes parts it embeds (the
predictor's pod spec, the model's container) against the Pod schema. The checks live in
``engine_checks.py``; the tests at the end plant a break in a copy and see each fail.
"""

from __future__ import annotations

import copy
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import kubernetes_validate  # type: ignore[import-untyped]
import pytest

from tests.deploy.engine_checks import (
    DRA_VERSIONS,
    GPU,
    KSERVE,
    PLAN_ANNOTATION,
    README,
    Rendered,
    check_dra,
    check_kserve,
    check_warm_pool,
    config_of,
    engines,
    flag,
    kinds,
    label_switches,
    named,
    planned_pools,
    planned_warm,
    pod_labels,
    render_tree,
)
from tests.deploy.test_manifests import CRD_GROUPS, K8S, SCHEMA_VERSIONS, render, selects

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
