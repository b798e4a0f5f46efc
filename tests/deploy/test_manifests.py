"""The Kubernetes manifests (deploy/k8s) and deploy/sync.py (the image: test_dockerfile.py).

Every overlay and the Kueue example are rendered with the real ``kubectl kustomize``; core
kinds are validated against the Kubernetes JSON schemas of ``kubernetes-validate`` (strict:
unknown fields fail); the custom resources (KEDA, Prometheus Operator, Kueue) by checks of the
fields their controllers need and of how they refer to each other; every metric a query names
must be one sluicegate (or Kueue) exports. The gateway config in each render is parsed with
sluicegate's own loader and its probes are asked of a real ``sluicegate serve``.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import tomllib
import urllib.request
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import kubernetes_validate
import pytest
import yaml

from sluicegate.config import Config, parse_config
from tests.deploy.promql import (
    EXTERNAL_SERIES,
    RULES,
    exported_series,
    metric_names,
    recorded_names,
)

REPO = Path(__file__).resolve().parents[2]
K8S = REPO / "deploy" / "k8s"
OVERLAYS = ("single", "distributed", "emulator")
RENDERS = (*(f"overlays/{name}" for name in OVERLAYS), "kueue")
SCHEMA_VERSIONS = ("1.30", "1.32")
KUSTOMIZE_MAJOR = 5
CRD_GROUPS = ("keda.sh", "monitoring.coreos.com", "kueue.x-k8s.io")
CLUSTER_SCOPED = {"Namespace", "ClusterQueue", "ResourceFlavor"}
PROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
IMAGE = f"registry.example.com/sluicegate:{PROJECT['version']}"


@cache
def _kubectl() -> str:
    """kubectl's path; fails (never skips) without one whose kustomize is v5 or newer."""
    path = shutil.which("kubectl")
    if path is None:
        pytest.fail("kubectl is not on PATH: install one with kustomize v5 (kubectl >= 1.27)")
    version = subprocess.run(
        [path, "version", "--client", "-o", "json"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    kustomize = re.match(
        r"v(\d+)\.", json.loads(version.stdout or "{}").get("kustomizeVersion", "")
    )
    if kustomize is None or int(kustomize.group(1)) < KUSTOMIZE_MAJOR:
        pytest.fail(
            f"{path} has no kustomize v{KUSTOMIZE_MAJOR}+ (components, labels, replicas): install "
            "kubectl >= 1.27 (Debian bookworm's kubernetes-client is 1.20, with kustomize v2)"
        )
    return path


@cache
def render(directory: str) -> tuple[dict[str, Any], ...]:
    """The objects ``kubectl kustomize deploy/k8s/DIRECTORY`` prints."""
    result = subprocess.run(
        [_kubectl(), "kustomize", str(K8S / directory)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, f"kubectl kustomize {directory}: {result.stderr}"
    return tuple(doc for doc in yaml.safe_load_all(result.stdout) if doc)


def objects(directory: str, kind: str) -> list[dict[str, Any]]:
    """The objects of ``kind`` in a render."""
    return [obj for obj in render(directory) if obj["kind"] == kind]


def one(directory: str, kind: str, name: str) -> dict[str, Any]:
    """The object of ``kind`` called ``name`` in a render (fails when absent)."""
    found = [obj for obj in objects(directory, kind) if obj["metadata"]["name"] == name]
    assert len(found) == 1, f"{directory}: expected one {kind} {name!r}, found {len(found)}"
    return found[0]


def gateway(directory: str) -> dict[str, Any]:
    """The gateway's Deployment."""
    return one(directory, "Deployment", "sluicegate")


def gateway_config(directory: str) -> tuple[Config, dict[str, Any]]:
    """The gateway's config (parsed by sluicegate) and the ConfigMap it came from."""
    volumes = gateway(directory)["spec"]["template"]["spec"]["volumes"]
    name = next(v["configMap"]["name"] for v in volumes if "configMap" in v)
    config_map = one(directory, "ConfigMap", name)
    text = config_map["data"]["sluicegate.yaml"]
    return parse_config(text, source=f"{directory} ConfigMap {name}"), config_map


def containers(obj: dict[str, Any]) -> list[dict[str, Any]]:
    """The containers of a workload's pod template."""
    return list(obj["spec"]["template"]["spec"]["containers"])


def selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    """Whether a matchLabels-style selector selects objects with ``labels``."""
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


def service_for_url(directory: str, url: str) -> dict[str, Any]:
    """The Service a URL's host names (``name`` or ``name.namespace...``) on one of its ports."""
    parts = urlsplit(url)
    host = (parts.hostname or "").split(".")
    service = one(directory, "Service", host[0])
    if len(host) > 1:
        assert host[1] == service["metadata"]["namespace"], f"{url}: another namespace"
    ports = {port["port"] for port in service["spec"]["ports"]}
    assert parts.port in ports, f"{url}: Service {host[0]} serves ports {ports}"
    return service


def env_fields(value: Any) -> Iterator[str]:
    """Every value of a ``*_env`` field anywhere in a config dump."""
    if isinstance(value, dict):
        for key, item in value.items():
            if key.endswith("_env") and isinstance(item, str):
                yield item
            else:
                yield from env_fields(item)
    elif isinstance(value, list | tuple):
        for item in value:
            yield from env_fields(item)


def unknown_metrics(expr: str) -> set[str]:
    """Names ``expr`` selects that neither sluicegate, Kueue nor our recording rules provide."""
    return metric_names(expr) - exported_series() - EXTERNAL_SERIES - recorded_names(RULES)


# --- rendering and schemas ---------------------------------------------------------------


@pytest.mark.parametrize("directory", RENDERS)
def test_kustomize_renders_with_namespaces(directory: str) -> None:
    """Each overlay and the Kueue example render; every namespaced object has a namespace."""
    rendered = render(directory)
    assert rendered
    for obj in rendered:
        if obj["kind"] not in CLUSTER_SCOPED:
            assert obj["metadata"].get("namespace"), f"{obj['kind']} {obj['metadata']['name']}"


@pytest.mark.parametrize("version", SCHEMA_VERSIONS)
@pytest.mark.parametrize("directory", RENDERS)
def test_core_kinds_match_kubernetes_schemas(directory: str, version: str) -> None:
    """Every object that is not a custom resource validates (strictly: no unknown fields)
    against the schema of its kind for a supported Kubernetes. Custom resources (KEDA,
    Prometheus Operator, Kueue) have no schema here: the tests below check them."""
    checked = 0
    for obj in render(directory):
        if obj["apiVersion"].split("/")[0] in CRD_GROUPS:
            continue
        try:
            kubernetes_validate.validate(obj, version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            pytest.fail(f"{directory}: {obj['kind']} {obj['metadata']['name']}: {exc}")
        checked += 1
    assert checked >= 2


@pytest.mark.parametrize("directory", [f"overlays/{name}" for name in OVERLAYS])
def test_every_container_is_pinned_non_root_read_only_and_bounded(directory: str) -> None:
    """Images come from ``images:`` (no bare ``sluicegate``); each container runs as a non-root
    user on a read-only root file system, with resource requests and limits."""
    for workload in objects(directory, "Deployment") + objects(directory, "StatefulSet"):
        pod = workload["spec"]["template"]["spec"]
        for container in containers(workload):
            where = f"{directory}: {workload['metadata']['name']}/{container['name']}"
            assert container["image"] == IMAGE or container["image"].startswith("valkey/"), where
            assert pod["securityContext"]["runAsNonRoot"] is True, where
            assert pod["securityContext"]["runAsUser"] > 0, where
            assert container["securityContext"]["readOnlyRootFilesystem"] is True, where
            assert container["securityContext"]["allowPrivilegeEscalation"] is False, where
            assert set(container["resources"]) == {"requests", "limits"}, where


# --- the gateway's config ----------------------------------------------------------------


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_config_parses_and_names_only_what_the_render_provides(overlay: str) -> None:
    """The ConfigMap's sluicegate.yaml parses with sluicegate's loader; the gateway listens on
    its container port; each backend URL and the store URL name a Service of the render; each
    ``*_env`` is set in the gateway's env from the Secret sluicegate-keys."""
    directory = f"overlays/{overlay}"
    config, _ = gateway_config(directory)
    (container,) = containers(gateway(directory))
    ports = {port["name"]: port["containerPort"] for port in container["ports"]}
    assert config.server.host == "0.0.0.0"
    assert ports["http"] == config.server.port
    assert container["command"][-2:] == ["--config", "/etc/sluicegate/sluicegate.yaml"]
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    assert mounts["config"] == "/etc/sluicegate"
    for model in config.models:
        for backend in model.backends:
            assert backend.url is not None
            service_for_url(directory, backend.url)
    if config.shared_store:
        service_for_url(directory, config.store)
    env = {item["name"]: item for item in container["env"]}
    for name in env_fields(config.model_dump()):
        assert name in env, f"{directory}: {name} is named by the config but not set"
        assert env[name]["valueFrom"]["secretKeyRef"]["name"] == "sluicegate-keys"
    assert config.pressure is not None
    for signal in config.pressure.signals:
        assert not unknown_metrics(signal.query), signal.query


def test_distributed_config_is_the_base_config_with_a_shared_store() -> None:
    """overlays/distributed differs from the others only in store: and distributed:."""
    single, _ = gateway_config("overlays/single")
    distributed, _ = gateway_config("overlays/distributed")
    assert not single.shared_store
    assert distributed.store.startswith("redis://")
    assert one("overlays/distributed", "StatefulSet", "valkey")["spec"]["serviceName"] == "valkey"
    differing = {"store", "distributed"}
    assert single.model_dump(exclude=differing) == distributed.model_dump(exclude=differing)


# --- probes, drain, disruption budget, Service ------------------------------------------


def test_gateway_probes_answer_on_a_real_gateway(tmp_path: Path) -> None:
    """``sluicegate serve`` with the rendered config (on loopback, engines unreachable) answers
    the startup and liveness path with 200 and, every model waiting for its backends, the
    readiness path with 200 too: a gateway in front of engines scaled to zero stays ready."""
    from sluicegate.demo.processes import free_port
    from tests.distributed.cluster import spawn, stop_children, wait_ready

    directory = "overlays/single"
    config, config_map = gateway_config(directory)
    assert all(model.wait_for_backends for model in config.models)
    (container,) = containers(gateway(directory))
    probes = {key: container[key]["httpGet"] for key in container if key.endswith("Probe")}
    assert set(probes) == {"startupProbe", "livenessProbe", "readinessProbe"}
    assert {probe["port"] for probe in probes.values()} == {"http"}
    path = tmp_path / "sluicegate.yaml"
    path.write_text(config_map["data"]["sluicegate.yaml"])
    env = {item["name"]: f"k8s-test-{item['name']}" for item in container["env"]}
    port = free_port()
    args = ["serve", "--config", str(path), "--host", "127.0.0.1", "--port", str(port)]
    child = spawn("gateway", args, port, tmp_path, env)
    try:
        wait_ready([(child, probes["startupProbe"]["path"])], timeout_s=30)
        for name, probe in probes.items():
            with urllib.request.urlopen(child.url + probe["path"], timeout=5) as answer:
                assert answer.status == 200, name
    finally:
        stop_children([child])


def test_engine_commands_run_and_answer_their_probes(tmp_path: Path) -> None:
    """Each emulated engine's command, run as is on a free loopback port, serves the model the
    gateway names on the port its container declares and answers its probes with 200."""
    from sluicegate.demo.processes import free_port
    from tests.distributed.cluster import spawn, stop_children, wait_ready

    config, _ = gateway_config("overlays/emulator")
    engines = [
        d
        for d in objects("overlays/emulator", "Deployment")
        if d["metadata"]["name"] != "sluicegate"
    ]
    assert len(engines) == len(config.models)
    children = []
    try:
        for engine in engines:
            (container,) = containers(engine)
            command = list(container["command"])
            assert command[:2] == ["sluicegate", "emulate"]
            assert container["ports"][0]["containerPort"] == int(
                command[command.index("--port") + 1]
            )
            assert command[command.index("--model") + 1] in {m.name for m in config.models}
            port = free_port()
            command[command.index("--port") + 1] = str(port)
            command[command.index("--host") + 1] = "127.0.0.1"
            name = engine["metadata"]["name"]
            children.append(spawn(name, command[1:], port, tmp_path, {}))
            paths = {container[k]["httpGet"]["path"] for k in ("readinessProbe", "livenessProbe")}
            wait_ready([(children[-1], path) for path in sorted(paths)], timeout_s=30)
    finally:
        stop_children(children)


def test_prestop_drains_with_a_real_command_within_the_grace_period() -> None:
    """preStop runs ``sluicegate drain`` (a real subcommand whose --help lists every option
    the hook passes), waiting less than terminationGracePeriodSeconds."""
    deployment = gateway("overlays/single")
    (container,) = containers(deployment)
    command = container["lifecycle"]["preStop"]["exec"]["command"]
    assert command[:2] == ["sluicegate", "drain"]
    helped = subprocess.run(
        [sys.executable, "-m", "sluicegate", *command[1:2], "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert helped.returncode == 0, f"`sluicegate drain --help` failed: {helped.stderr}"
    for option in (arg for arg in command[2:] if arg.startswith("--")):
        assert option in helped.stdout, f"`sluicegate drain` has no {option}"
    wait_s = float(command[command.index("--wait-s") + 1])
    assert wait_s < deployment["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_pdb_service_and_spread_select_the_gateway_pods(overlay: str) -> None:
    """The PDB, the Service and both topology spread constraints select exactly the gateway's
    pods; the Service's target port is the container's named port; replicas as the overlay
    says (3 in distributed)."""
    directory = f"overlays/{overlay}"
    deployment = gateway(directory)
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    pdb = one(directory, "PodDisruptionBudget", "sluicegate")
    service = one(directory, "Service", "sluicegate")
    spread = deployment["spec"]["template"]["spec"]["topologySpreadConstraints"]
    selectors = [pdb["spec"]["selector"]["matchLabels"], service["spec"]["selector"]]
    selectors += [c["labelSelector"]["matchLabels"] for c in spread]
    for workload in objects(directory, "Deployment") + objects(directory, "StatefulSet"):
        pod_labels = workload["spec"]["template"]["metadata"]["labels"]
        for selector in selectors:
            assert selects(selector, pod_labels) == (workload is deployment), selector
    assert selects(deployment["spec"]["selector"]["matchLabels"], labels)
    assert {c["topologyKey"] for c in spread} == {
        "kubernetes.io/hostname",
        "topology.kubernetes.io/zone",
    }
    assert service["spec"]["ports"][0]["targetPort"] == "http"
    assert deployment["spec"]["replicas"] == (3 if overlay == "distributed" else 1)


# --- custom resources ---------------------------------------------------------------------


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_service_monitor_scrapes_the_gateway_service(overlay: str) -> None:
    """The ServiceMonitor selects the gateway Service's labels and scrapes a port it has."""
    directory = f"overlays/{overlay}"
    (monitor,) = objects(directory, "ServiceMonitor")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    services = objects(directory, "Service")
    matched = [
        s
        for s in services
        if selects(monitor["spec"]["selector"]["matchLabels"], s["metadata"]["labels"])
    ]
    assert [s["metadata"]["name"] for s in matched] == ["sluicegate"]
    port_names = {port["name"] for port in matched[0]["spec"]["ports"]}
    for endpoint in monitor["spec"]["endpoints"]:
        assert endpoint["port"] in port_names
        assert endpoint["path"] == "/metrics"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_prometheus_rule_is_rules_yml_and_names_exported_metrics(overlay: str) -> None:
    """The PrometheusRule's groups are deploy/prometheus/rules.yml's; every metric its
    expressions name is exported (or recorded by another rule)."""
    (rule,) = objects(f"overlays/{overlay}", "PrometheusRule")
    assert rule["apiVersion"] == "monitoring.coreos.com/v1"
    groups = yaml.safe_load(RULES.read_text())["groups"]
    assert rule["spec"]["groups"] == groups
    for group in groups:
        for item in group["rules"]:
            assert not unknown_metrics(str(item["expr"])), item


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_grafana_dashboard_config_map_is_the_dashboard(overlay: str) -> None:
    """A ConfigMap labelled grafana_dashboard "1" holds deploy/grafana's dashboard as is."""
    source = REPO / "deploy" / "grafana" / "sluicegate-dashboard.json"
    (config_map,) = [
        c
        for c in objects(f"overlays/{overlay}", "ConfigMap")
        if c["metadata"].get("labels", {}).get("grafana_dashboard") == "1"
    ]
    assert config_map["data"] == {source.name: source.read_text()}


def test_scaled_objects_scale_each_model_engine_on_its_queue() -> None:
    """One ScaledObject per engine Deployment; its target is the Deployment behind the model's
    backend Service; two Prometheus triggers with string metadata: queue-wait p95 of that model
    (Value, 0.5 s) and its queue depth (AverageValue, activating from zero); from zero only for
    a model that waits for backends; 30 s up-scale stabilization, slower down-scale."""
    directory = "overlays/emulator"
    config, _ = gateway_config(directory)
    scaled = objects(directory, "ScaledObject")
    engines = [d for d in objects(directory, "Deployment") if d["metadata"]["name"] != "sluicegate"]
    targets = sorted(s["spec"]["scaleTargetRef"]["name"] for s in scaled)
    assert targets == sorted(e["metadata"]["name"] for e in engines)
    assert len(scaled) == len(config.models)
    for obj in scaled:
        spec = obj["spec"]
        assert obj["apiVersion"] == "keda.sh/v1alpha1"
        assert spec["scaleTargetRef"]["kind"] == "Deployment"
        engine = one(directory, "Deployment", spec["scaleTargetRef"]["name"])
        assert "replicas" not in engine["spec"], "KEDA owns the engine's replica count"
        triggers = {t["name"]: t for t in spec["triggers"]}
        assert set(triggers) == {"queue-wait-p95", "queue-depth"}
        models = set()
        for trigger in triggers.values():
            metadata = trigger["metadata"]
            assert trigger["type"] == "prometheus"
            assert all(isinstance(value, str) for value in metadata.values()), metadata
            assert urlsplit(metadata["serverAddress"]).scheme == "http"
            assert config.pressure is not None
            assert metadata["serverAddress"] == config.pressure.prometheus_url
            assert float(metadata["threshold"]) > 0
            assert not unknown_metrics(metadata["query"]), metadata["query"]
            models |= set(re.findall(r'model="([^"]+)"', metadata["query"]))
        (model_name,) = models
        model = next(m for m in config.models if m.name == model_name)
        (backend,) = model.backends
        assert backend.url is not None
        service = service_for_url(directory, backend.url)
        pod_labels = engine["spec"]["template"]["metadata"]["labels"]
        assert selects(service["spec"]["selector"], pod_labels)
        (container,) = containers(engine)
        assert container["command"][container["command"].index("--model") + 1] == model.name
        wait, depth = triggers["queue-wait-p95"], triggers["queue-depth"]
        assert wait["metricType"] == "Value"
        assert wait["metadata"]["threshold"] == "0.5"
        assert "histogram_quantile(0.95" in wait["metadata"]["query"]
        assert depth["metricType"] == "AverageValue"
        assert float(depth["metadata"]["activationThreshold"]) == 0
        assert spec["minReplicaCount"] == 0
        assert model.wait_for_backends, f"{model.name} scales from zero: it must wait for backends"
        assert spec["maxReplicaCount"] >= 1
        behavior = spec["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]
        assert behavior["scaleUp"]["stabilizationWindowSeconds"] == 30
        assert behavior["scaleDown"]["stabilizationWindowSeconds"] > 30


# Fields of KEDA 2.x's ScaledObject (keda.sh/v1alpha1) and its Prometheus trigger: a name
# outside these is a typo KEDA's webhook would reject or, worse, silently ignore.
KEDA_SPEC = {
    "scaleTargetRef", "pollingInterval", "cooldownPeriod", "initialCooldownPeriod",
    "idleReplicaCount", "minReplicaCount", "maxReplicaCount", "advanced", "triggers", "fallback",
}  # fmt: skip
KEDA_ADVANCED = {
    "horizontalPodAutoscalerConfig",
    "restoreToOriginalReplicaCount",
    "scalingModifiers",
}
KEDA_TRIGGER = {"type", "name", "metadata", "metricType", "authenticationRef", "useCachedMetrics"}
KEDA_PROMETHEUS = {
    "serverAddress", "query", "threshold", "activationThreshold", "namespace", "customHeaders",
    "ignoreNullValues", "queryParameters", "unsafeSsl", "timeout", "authModes",
}  # fmt: skip


@pytest.mark.parametrize("version", SCHEMA_VERSIONS)
def test_scaled_objects_use_only_keda_fields_and_a_valid_hpa_behavior(version: str) -> None:
    """Every ScaledObject field is one KEDA knows; the HPA behavior it hands to the
    HorizontalPodAutoscaler KEDA creates validates against autoscaling/v2's schema."""
    for obj in objects("overlays/emulator", "ScaledObject"):
        spec = obj["spec"]
        assert set(spec) <= KEDA_SPEC, set(spec) - KEDA_SPEC
        assert set(spec["advanced"]) <= KEDA_ADVANCED
        assert set(spec["advanced"]["horizontalPodAutoscalerConfig"]) <= {"name", "behavior"}
        for trigger in spec["triggers"]:
            assert set(trigger) <= KEDA_TRIGGER, set(trigger) - KEDA_TRIGGER
            assert set(trigger["metadata"]) <= KEDA_PROMETHEUS, trigger["metadata"]
        hpa = {
            "apiVersion": "autoscaling/v2",
            "kind": "HorizontalPodAutoscaler",
            "metadata": {"name": obj["metadata"]["name"]},
            "spec": {
                "scaleTargetRef": spec["scaleTargetRef"],
                "minReplicas": 1,
                "maxReplicas": spec["maxReplicaCount"],
                "behavior": spec["advanced"]["horizontalPodAutoscalerConfig"]["behavior"],
            },
        }
        kubernetes_validate.validate(hpa, version, strict=True)


def test_kueue_example_queues_the_job_on_the_gpu_cluster_queue() -> None:
    """LocalQueue batch → ClusterQueue gpu → a ResourceFlavor of the render; every flavor quotes
    exactly the covered resources; the Job waits suspended with the queue-name label; and the
    gateway's pressure query watches that ClusterQueue."""
    directory = "kueue"
    cluster_queue = one(directory, "ClusterQueue", "gpu")
    flavors = {f["metadata"]["name"] for f in objects(directory, "ResourceFlavor")}
    for group in cluster_queue["spec"]["resourceGroups"]:
        for flavor in group["flavors"]:
            assert flavor["name"] in flavors
            assert [r["name"] for r in flavor["resources"]] == group["coveredResources"]
    local = one(directory, "LocalQueue", "batch")
    assert local["spec"]["clusterQueue"] == "gpu"
    (job,) = objects(directory, "Job")
    assert job["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "batch"
    assert job["metadata"]["namespace"] == local["metadata"]["namespace"]
    assert job["spec"]["suspend"] is True
    config, _ = gateway_config("overlays/single")
    assert config.pressure is not None
    watched = {
        q for s in config.pressure.signals for q in re.findall(r'cluster_queue="(\w+)"', s.query)
    }
    assert watched == {"gpu"}


# --- deploy/sync.py -----------------------------------------------------------------------


def _sync(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(REPO / "deploy" / "sync.py"), "--root", str(root), *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_sync_copies_are_current() -> None:
    """The repository's copies match their sources (``deploy/sync.py --check`` exits 0)."""
    result = _sync(REPO, "--check")
    assert result.returncode == 0, result.stderr


def test_sync_check_fails_on_stale_copies_and_sync_fixes_them(tmp_path: Path) -> None:
    """In a copy of deploy/: an edited source makes ``--check`` exit 1 naming its copy; a run
    of the script rewrites it and ``--check`` passes again; a missing source exits 2."""
    shutil.copytree(REPO / "deploy", tmp_path / "deploy")
    rules = tmp_path / "deploy" / "prometheus" / "rules.yml"
    rules.write_text(rules.read_text().replace("groups:", "groups:\n  - {name: extra, rules: []}"))
    base = tmp_path / "deploy" / "k8s" / "base" / "sluicegate.yaml"
    base.write_text(base.read_text() + "# edited\n")
    checked = _sync(tmp_path, "--check")
    assert checked.returncode == 1
    stale = set(re.findall(r"stale: (\S+)", checked.stderr))
    assert stale == {
        "deploy/k8s/components/monitoring/prometheusrule.yaml",
        "deploy/k8s/overlays/distributed/sluicegate.yaml",
    }
    assert _sync(tmp_path).returncode == 0
    assert _sync(tmp_path, "--check").returncode == 0
    copied = tmp_path / "deploy" / "k8s" / "components" / "monitoring" / "prometheusrule.yaml"
    assert yaml.safe_load(copied.read_text())["spec"]["groups"][0]["name"] == "extra"
    rules.unlink()
    assert _sync(tmp_path, "--check").returncode == 2
