"""KEDA thresholds that go with a warm-buffer plan, and the ScaledObject fragment to paste.

Two Prometheus triggers per engine Deployment, on what the gateway sees for its
model (the metric names of DESIGN §10, the queries of ``deploy/k8s``):

* **queue-wait quantile** (``metricType: Value``): the HPA wants
  ``replicas · value / threshold``. The threshold is the wait quantile (p95 by
  default) the model predicts at the arrival rate where the replicas normally
  up (base + warm) reach the p99 SLO, so it crossing means the SLO is about to be
  missed. Floored at the histogram's smallest bucket, 5 ms.
* **queue depth** (``metricType: AverageValue``): the HPA wants
  ``depth / target`` replicas. With every slot busy, an arrival behind d others
  waits about ``d/(cμ)`` (FCFS), so the wait crosses the threshold at a depth of
  ``threshold · c · μ``, i.e. ``threshold · slots/E[S]`` per replica. Little's
  law gives the mean depth per replica at the planned operating point, shown for
  comparison: the target should sit well above it.

``minReplicaCount`` is base + warm; ``maxReplicaCount`` the replicas that meet
the SLO at the burst rate for good (at least min + 1). A model allowed to sleep
gets ``idleReplicaCount: 0`` (KEDA scales to 0 when no trigger is active and
straight back to min when one is) and a third trigger on in-flight plus queued
requests, so traffic that never queues still counts as activity.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from sluicegate.planner.backlog import bisect_boundary
from sluicegate.planner.queueing import PlanInput, allen_cunneen_wait
from sluicegate.planner.warm_buffer import WarmPlan

__all__ = [
    "DEFAULT_MODEL",
    "DEFAULT_PROMETHEUS_URL",
    "POLLING_INTERVAL_S",
    "SMALLEST_WAIT_BUCKET_S",
    "KedaPlan",
    "plan_keda",
    "saturation_rate",
    "scaled_object_fragment",
]

DEFAULT_MODEL = "MODEL"
DEFAULT_PROMETHEUS_URL = "http://prometheus-operated.monitoring.svc:9090"
SMALLEST_WAIT_BUCKET_S = 0.005
"""The smallest bucket of ``sluicegate_queue_wait_seconds``: below it histogram_quantile guesses."""
POLLING_INTERVAL_S = 5
"""KEDA's query period; from zero, the first request waits this plus the scale-up time."""
SCALE_UP_STABILIZATION_S = 30
SCALE_DOWN_STABILIZATION_S = 600
COOLDOWN_S = 300
RATE_WINDOW = "1m"


def _wait_quantile(inp: PlanInput, lam: float, replicas: int, q: float) -> float:
    """Allen–Cunneen q-quantile of the wait at rate lam with replicas up (inf if unstable)."""
    c = replicas * inp.slots_per_replica
    if lam * inp.mean_service_s >= c:
        return math.inf
    return allen_cunneen_wait(
        lam, inp.mean_service_s, inp.cv_arrival, inp.cv_service, c
    ).wait_quantile(q)


def saturation_rate(inp: PlanInput, replicas: int) -> float:
    """The arrival rate at which ``replicas`` reach the p99-wait SLO (bisection, 1e-9 relative).

    The p99 rises with the rate and is unbounded as it nears ``c·μ``, so the
    answer lies in (0, c·μ).

    Args:
        inp: Service, variability and SLO (its arrival rate is not used).
        replicas: Replicas up, >= 1.
    """
    capacity = replicas * inp.slots_per_replica / inp.mean_service_s
    lo, _ = bisect_boundary(
        lambda rate: _wait_quantile(inp, rate, replicas, 0.99) <= inp.p99_wait_slo_s,
        0.0,
        capacity,
        1e-9,
    )
    return lo


@dataclass(frozen=True, slots=True)
class KedaPlan:
    """Autoscaling settings for one model's engine Deployment.

    Attributes:
        model: The model label the queries select.
        prometheus_url: KEDA's serverAddress.
        wait_quantile: Quantile of the queue-wait trigger (0.95: the playbook's p95).
        wait_threshold_s: Queue-wait trigger threshold, seconds.
        saturation_rate: Arrival rate (req/s) at which min_replicas reach the p99 SLO.
        depth_per_replica: Queue-depth trigger's AverageValue target, requests per replica.
        mean_depth_per_replica: Little's-law mean queue per replica at the planned point.
        min_replicas: minReplicaCount, base + warm.
        max_replicas: maxReplicaCount.
        scale_up_pods: Pods the HPA may add per 15 s (reach max from min in one step).
        scale_to_zero: Whether the fragment lets the model sleep (idleReplicaCount 0).
        slots_per_replica: Slots of one replica (the activity trigger's target).
        cold_start_s: From zero, about how long the first request waits for a replica.
        note: A caveat about the threshold, or "".
    """

    model: str
    prometheus_url: str
    wait_quantile: float
    wait_threshold_s: float
    saturation_rate: float
    depth_per_replica: int
    mean_depth_per_replica: float
    min_replicas: int
    max_replicas: int
    scale_up_pods: int
    scale_to_zero: bool
    slots_per_replica: int
    cold_start_s: float
    note: str

    @property
    def selector(self) -> str:
        """The PromQL label matcher for the model, escaped for a double-quoted string."""
        escaped = self.model.replace("\\", "\\\\").replace('"', '\\"')
        return f'model="{escaped}"'

    @property
    def wait_query(self) -> str:
        """The queue-wait trigger's query; NaN (no requests in the window) becomes 0."""
        return (
            f"(histogram_quantile({self.wait_quantile:g}, sum by (le) "
            f"(rate(sluicegate_queue_wait_seconds_bucket{{{self.selector}}}[{RATE_WINDOW}])))"
            " >= 0) or vector(0)"
        )

    @property
    def depth_query(self) -> str:
        """The queue-depth trigger's query: requests waiting at every gateway."""
        return f"sum(sluicegate_queue_depth{{{self.selector}}}) or vector(0)"

    @property
    def activity_query(self) -> str:
        """The activity trigger's query (scale-to-zero only): in flight plus queued."""
        return (
            f"(sum(sluicegate_inflight_requests{{{self.selector}}}) or vector(0))"
            f" + (sum(sluicegate_queue_depth{{{self.selector}}}) or vector(0))"
        )


def plan_keda(
    warm: WarmPlan,
    *,
    model: str = DEFAULT_MODEL,
    prometheus_url: str = DEFAULT_PROMETHEUS_URL,
    wait_quantile: float = 0.95,
    scale_to_zero: bool = False,
) -> KedaPlan:
    """Derive the KEDA thresholds and replica bounds for a warm-buffer plan.

    Args:
        warm: The warm-buffer plan.
        model: Model name, as in the gateway config and the metrics' model label.
        prometheus_url: Prometheus base URL KEDA queries.
        wait_quantile: Quantile of the queue-wait trigger, in [0.5, 1).
        scale_to_zero: Let the model scale to zero when idle.

    Raises:
        ValueError: On an empty or unprintable model name or a quantile outside [0.5, 1).
    """
    if not model or not model.isprintable():
        raise ValueError(f"model must be a non-empty printable name, got {model!r}")
    if not 0.5 <= wait_quantile < 1.0:
        raise ValueError(f"wait quantile must be in [0.5, 1), got {wait_quantile!r}")
    inp = warm.capacity.input
    replicas = warm.min_replicas
    rate = saturation_rate(inp, replicas)
    at_saturation = _wait_quantile(inp, rate, replicas, wait_quantile)
    threshold = max(float(f"{at_saturation:.3g}"), SMALLEST_WAIT_BUCKET_S)
    note = ""
    if at_saturation < SMALLEST_WAIT_BUCKET_S:
        note = (
            f"at {replicas} replicas the p{wait_quantile * 100:g} wait is still under "
            f"{SMALLEST_WAIT_BUCKET_S * 1000:g} ms when the p99 reaches the SLO (few requests "
            "wait at all); the threshold is the smallest bucket, so it fires late: "
            "consider --trigger-quantile 0.99"
        )
    per_replica_drain = inp.slots_per_replica / inp.mean_service_s
    planned = allen_cunneen_wait(
        inp.arrival_rate,
        inp.mean_service_s,
        inp.cv_arrival,
        inp.cv_service,
        replicas * inp.slots_per_replica,
    )
    if warm.burst_replicas is None:
        max_replicas = inp.max_replicas
    else:
        max_replicas = max(warm.burst_replicas, replicas + 1)
    return KedaPlan(
        model=model,
        prometheus_url=prometheus_url,
        wait_quantile=wait_quantile,
        wait_threshold_s=threshold,
        saturation_rate=rate,
        depth_per_replica=max(1, math.ceil(threshold * per_replica_drain)),
        mean_depth_per_replica=planned.mean_queue_len / replicas,
        min_replicas=replicas,
        max_replicas=max_replicas,
        scale_up_pods=max(1, max_replicas - replicas),
        scale_to_zero=scale_to_zero,
        slots_per_replica=inp.slots_per_replica,
        cold_start_s=POLLING_INTERVAL_S + warm.burst.scale_up_s,
        note=note,
    )


def _yaml_single_quoted(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def _trigger(name: str, metric_type: str, url: str, query: str, threshold: str) -> list[str]:
    return [
        "  - type: prometheus",
        f"    name: {name}",
        f"    metricType: {metric_type}",
        "    metadata:",
        f"      serverAddress: {_yaml_single_quoted(url)}",
        f"      query: {_yaml_single_quoted(query)}",
        f"      threshold: '{threshold}'",
        "      activationThreshold: '0'",
    ]


def scaled_object_fragment(keda: KedaPlan) -> str:
    """The ScaledObject ``spec`` fields to paste: replica bounds, HPA behaviour, triggers.

    Keep ``scaleTargetRef`` from the existing object; everything here replaces
    the fields of the same name.

    Args:
        keda: The thresholds to write.
    """
    lines = [
        f"# sluicegate plan for model {keda.model}: paste under the ScaledObject's spec:",
        f"pollingInterval: {POLLING_INTERVAL_S}",
    ]
    if keda.scale_to_zero:
        lines += [
            f"cooldownPeriod: {COOLDOWN_S}          # idle this long before scaling to zero",
            "idleReplicaCount: 0            # no trigger active: 0 replicas",
        ]
    lines += [
        f"minReplicaCount: {keda.min_replicas}             # base + warm buffer",
        f"maxReplicaCount: {keda.max_replicas}             # meets the SLO at the burst rate",
        "advanced:",
        "  horizontalPodAutoscalerConfig:",
        "    behavior:",
        "      scaleUp:",
        f"        stabilizationWindowSeconds: {SCALE_UP_STABILIZATION_S}  # above target for 30 s",
        "        selectPolicy: Max",
        "        policies:",
        f"          - {{type: Pods, value: {keda.scale_up_pods}, periodSeconds: 15}}",
        "          - {type: Percent, value: 100, periodSeconds: 15}",
        "      scaleDown:",
        f"        stabilizationWindowSeconds: {SCALE_DOWN_STABILIZATION_S}",
        "        selectPolicy: Min",
        "        policies:",
        "          - {type: Pods, value: 1, periodSeconds: 120}",
        "triggers:",
    ]
    wait_name = f"queue-wait-p{keda.wait_quantile * 100:g}".replace(".", "-")
    lines += _trigger(
        wait_name, "Value", keda.prometheus_url, keda.wait_query, f"{keda.wait_threshold_s:g}"
    )
    lines += _trigger(
        "queue-depth",
        "AverageValue",
        keda.prometheus_url,
        keda.depth_query,
        str(keda.depth_per_replica),
    )
    if keda.scale_to_zero:
        lines += _trigger(
            "activity",
            "AverageValue",
            keda.prometheus_url,
            keda.activity_query,
            str(keda.slots_per_replica),
        )
    return "\n".join(lines) + "\n"
