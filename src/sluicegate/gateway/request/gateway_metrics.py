"""Prometheus metrics of the gateway (DESIGN §10); every metric name lives here.

Counters and histograms are updated as requests end; gauges (queue depth,
in-flight, limits, backend state) are read from the scheduler at scrape time,
so the hot path never touches them.
"""

from __future__ import annotations

import hashlib
import math
import time
from collections import deque
from collections.abc import Callable, Collection, Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from sluicegate.core.scheduler import Scheduler
from sluicegate.core.ticket import Outcome
from sluicegate.core.views import OTHER_TENANT, tenant_bucket, tenant_totals

LATENCY_BUCKETS = (
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    20.0,
    40.0,
    80.0,
    160.0,
    320.0,
)
TENANT_HASH_HEX = 12
"""Hex digits of SHA-256 a hashed tenant label keeps (``server.metrics_tenant_label: hash``)."""
WAIT_WINDOW_S = 60.0
"""How far back ``/admin/state``'s queue-wait quantiles look."""
WAIT_WINDOW_MAX = 4096
"""Waits kept per lane for them (the latest, at high rates)."""


class _SchedulerGauges(Collector):
    """Gauges computed from a scheduler snapshot at scrape time (health judged at ``clock()``)."""

    def __init__(self, scheduler: Scheduler, clock: Callable[[], float]) -> None:
        self._scheduler = scheduler
        self._clock = clock
        models = scheduler.spec.models
        self._adaptive = {model.name: model.adaptive is not None for model in models}
        self._slo = {
            model.name: [(lane.name, lane.slo_ms / 1000.0) for lane in model.lanes]
            for model in models
        }

    def collect(self) -> Iterator[GaugeMetricFamily]:
        depth = GaugeMetricFamily(
            "sluicegate_queue_depth", "Requests waiting per lane.", labels=["model", "lane"]
        )
        inflight = GaugeMetricFamily(
            "sluicegate_inflight_requests", "Requests running per lane.", labels=["model", "lane"]
        )
        limit = GaugeMetricFamily(
            "sluicegate_concurrency_limit",
            "Effective concurrency limit per lane (lane cap within the model's adaptive limit).",
            labels=["model", "lane"],
        )
        tokens = GaugeMetricFamily(
            "sluicegate_inflight_tokens",
            "Prompt plus predicted output tokens of running requests.",
            labels=["model"],
        )
        kv = GaugeMetricFamily(
            "sluicegate_backend_kv_cache_usage",
            "Engine KV-cache usage (0-1) last scraped.",
            labels=["model", "backend"],
        )
        healthy = GaugeMetricFamily(
            "sluicegate_backend_healthy",
            "1 if the backend takes traffic (probe up, circuit not open within a cool-down).",
            labels=["model", "backend"],
        )
        age = GaugeMetricFamily(
            "sluicegate_backend_metrics_age_seconds",
            "Seconds since the engine's metrics were last scraped well (absent: never).",
            labels=["model", "backend"],
        )
        stale = GaugeMetricFamily(
            "sluicegate_backend_metrics_stale",
            "1 if the engine's metrics are older than metrics_stale_after_s: it counts as full.",
            labels=["model", "backend"],
        )
        model_limit = GaugeMetricFamily(
            "sluicegate_model_concurrency_limit",
            "Effective model-wide concurrency limit (max_concurrency within the adaptive limit).",
            labels=["model"],
        )
        model_floor = GaugeMetricFamily(
            "sluicegate_model_concurrency_floor",
            "The adaptive limit's floor (max_concurrency when the model has no adaptive limit).",
            labels=["model"],
        )
        adaptive = GaugeMetricFamily(
            "sluicegate_adaptive_limit_enabled",
            "1 if the model's concurrency follows an adaptive limit.",
            labels=["model"],
        )
        slo = GaugeMetricFamily(
            "sluicegate_lane_slo_seconds",
            "The lane's configured end-to-end SLO (slo_ms), in seconds.",
            labels=["model", "lane"],
        )
        for name in self._scheduler.models():
            view = self._scheduler.view(name, self._clock())
            for lane in view.lanes:
                depth.add_metric([name, lane.name], lane.queued)
                inflight.add_metric([name, lane.name], lane.running)
                limit.add_metric([name, lane.name], min(lane.cap, view.cap))
            tokens.add_metric([name], view.inflight_tokens)
            model_limit.add_metric([name], view.cap)
            model_floor.add_metric([name], view.floor)
            adaptive.add_metric([name], 1.0 if self._adaptive[name] else 0.0)
            for lane_spec in self._slo[name]:
                slo.add_metric([name, lane_spec[0]], lane_spec[1])
            for backend in view.backends:
                if backend.kv_cache_usage is not None:
                    kv.add_metric([name, backend.name], backend.kv_cache_usage)
                healthy.add_metric([name, backend.name], 1.0 if backend.healthy else 0.0)
                if backend.metrics_age_s is not None:
                    age.add_metric([name, backend.name], backend.metrics_age_s)
                stale.add_metric([name, backend.name], 1.0 if backend.metrics_stale else 0.0)
        yield from (depth, inflight, limit, tokens, kv, healthy, age, stale)
        yield from (model_limit, model_floor, adaptive, slo)


class _TenantGauges(Collector):
    """This process's running requests per tenant, read from the scheduler at scrape time."""

    def __init__(
        self,
        scheduler: Scheduler,
        configured: Collection[str],
        exposed: Callable[[str], tuple[str, ...]],
    ) -> None:
        self._scheduler = scheduler
        self._configured = configured
        self._exposed = exposed

    def collect(self) -> Iterator[GaugeMetricFamily]:
        family = GaugeMetricFamily(
            "sluicegate_tenant_inflight_requests",
            "Requests running in this process per tenant (configured tenants; others are "
            "'other'); a request counts once, whatever its n.",
            labels=["model", "tenant"],
        )
        for name in self._scheduler.models():
            running = self._scheduler.tenants_running(name)
            for tenant, count in tenant_totals(running, self._configured).items():
                family.add_metric([name, *self._exposed(tenant)], count)
        yield family


class LaneMetrics:
    """The metric children of one (model, lane), looked up once instead of per request,
    and the lane's recent queue waits, which ``/admin/state`` shows."""

    __slots__ = (
        "_clock",
        "_outcomes",
        "_requests",
        "_values",
        "_waits",
        "duration",
        "queue_wait",
        "ttft",
    )

    def __init__(self, metrics: GatewayMetrics, model: str, lane: str) -> None:
        self.queue_wait = metrics.queue_wait.labels(model, lane)
        self.ttft = metrics.ttft.labels(model, lane)
        self.duration = metrics.duration.labels(model, lane)
        self._requests = metrics.requests
        self._values = (model, lane)
        self._outcomes: dict[Outcome, Counter] = {}
        self._waits: deque[tuple[float, float]] = deque(maxlen=WAIT_WINDOW_MAX)
        self._clock = metrics.clock

    def ended(self, outcome: Outcome) -> None:
        """Count one request of this lane ending with ``outcome``."""
        child = self._outcomes.get(outcome)
        if child is None:
            child = self._outcomes[outcome] = self._requests.labels(*self._values, outcome.value)
        child.inc()

    def waited(self, seconds: float) -> None:
        """A request of this lane was admitted after waiting ``seconds``."""
        self.queue_wait.observe(seconds)
        self._waits.append((self._clock(), seconds))

    def recent_waits(self) -> dict[str, float | int | None]:
        """Queue waits of the last ``WAIT_WINDOW_S``: count and p50/p95/p99 (nearest rank)."""
        since = self._clock() - WAIT_WINDOW_S
        waits = sorted(wait for at, wait in self._waits if at >= since)
        answer: dict[str, float | int | None] = {"count": len(waits)}
        for name, q in (("p50", 0.50), ("p95", 0.95), ("p99", 0.99)):
            answer[name] = waits[max(0, math.ceil(q * len(waits)) - 1)] if waits else None
        return answer


class GatewayMetrics:
    """All of the gateway's metrics, in a registry of its own."""

    def __init__(
        self,
        scheduler: Scheduler,
        tenants: Collection[str],
        clock: Callable[[], float] = time.monotonic,
        *,
        tenant_label: str = "name",
    ) -> None:
        self.registry = CollectorRegistry()
        self.clock = clock
        self._tenants = frozenset(tenants)
        self._tenant_mode = tenant_label
        # (model, tenant label) -> [requests, prompt tokens, completion tokens]
        self.usage: dict[tuple[str, str], list[int]] = {}
        self.queue_wait = Histogram(
            "sluicegate_queue_wait_seconds",
            "Time from arrival to admission.",
            ["model", "lane"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.ttft = Histogram(
            "sluicegate_time_to_first_token_seconds",
            "Time from arrival to the first streamed token (or the whole answer).",
            ["model", "lane"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.duration = Histogram(
            "sluicegate_request_duration_seconds",
            "Time from arrival to the end of the response.",
            ["model", "lane"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.requests = Counter(
            "sluicegate_requests",
            "Requests by how they ended.",
            ["model", "lane", "outcome"],
            registry=self.registry,
        )
        # server.metrics_tenant_label: none drops the label, so the family sums every tenant.
        self.tokens = Counter(
            "sluicegate_tokens",
            "Tokens served, by tenant (configured tenants only; others are 'other').",
            ["model", "kind"] if tenant_label == "none" else ["model", "tenant", "kind"],
            registry=self.registry,
        )
        self.registry.register(_SchedulerGauges(scheduler, clock))
        if tenant_label != "none":  # without a tenant label, sluicegate_inflight_requests says it
            self.registry.register(_TenantGauges(scheduler, self._tenants, self.exposed_tenant))
        self._lanes: dict[tuple[str, str], LaneMetrics] = {}
        self._token_children: dict[tuple[str, str], tuple[Counter, Counter, list[int]]] = {}

    def outcome_counts(self) -> dict[tuple[str, str], dict[str, int]]:
        """Requests ended so far, by (model, lane) and outcome, as ``sluicegate_requests``
        counts them."""
        counts: dict[tuple[str, str], dict[str, int]] = {}
        for family in self.requests.collect():
            for sample in family.samples:
                if sample.name.endswith("_total"):
                    labels = sample.labels
                    lane = counts.setdefault((labels["model"], labels["lane"]), {})
                    lane[labels["outcome"]] = int(sample.value)
        return counts

    def lane(self, model: str, lane: str) -> LaneMetrics:
        """The cached children of ``(model, lane)``."""
        found = self._lanes.get((model, lane))
        if found is None:
            found = self._lanes[(model, lane)] = LaneMetrics(self, model, lane)
        return found

    def tenant_label(self, tenant: str) -> str:
        """The tenant as a bounded value (a configured name, else ``other``), as
        ``/admin/state`` shows it."""
        return tenant_bucket(tenant, self._tenants)

    def exposed_tenant(self, label: str) -> tuple[str, ...]:
        """The ``tenant`` label values ``/metrics`` shows for ``label`` (of ``tenant_label``):
        the name, its hash, or nothing (``server.metrics_tenant_label``)."""
        if self._tenant_mode == "none":
            return ()
        if self._tenant_mode == "hash" and label != OTHER_TENANT:
            return (hashlib.sha256(label.encode()).hexdigest()[:TENANT_HASH_HEX],)
        return (label,)

    def served(self, model: str, tenant: str, prompt_tokens: int, completion_tokens: int) -> None:
        """Count tokens served for ``tenant``."""
        children = self._token_children.get((model, tenant))
        if children is None:
            label = self.tenant_label(tenant)
            exposed = self.exposed_tenant(label)
            children = (
                self.tokens.labels(model, *exposed, "prompt"),
                self.tokens.labels(model, *exposed, "completion"),
                self.usage.setdefault((model, label), [0, 0, 0]),
            )
            if len(self._token_children) < 100_000:
                self._token_children[(model, tenant)] = children
        children[0].inc(prompt_tokens)
        children[1].inc(completion_tokens)
        usage = children[2]
        usage[0] += 1
        usage[1] += prompt_tokens
        usage[2] += completion_tokens
