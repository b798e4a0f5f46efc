"""Prometheus metrics of the KV event subscribers (DESIGN §10): what each backend's stream
brought, and how many blocks its index holds (read at scrape time)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Literal

from prometheus_client import CollectorRegistry, Counter
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from sluicegate.core.scheduler import Scheduler

__all__ = ["OUTCOMES", "KvEventMetrics", "Outcome"]

Outcome = Literal["applied", "replayed", "malformed", "gap", "reset"]
OUTCOMES: tuple[Outcome, ...] = ("applied", "replayed", "malformed", "gap", "reset")


class KvEventMetrics:
    """``sluicegate_kv_events_total{model,backend,outcome}`` and
    ``sluicegate_kv_index_blocks{model,backend}`` for the backends in ``backends``
    (``(model, backend)`` pairs); every outcome of each starts at 0."""

    def __init__(
        self,
        registry: CollectorRegistry,
        scheduler: Scheduler,
        backends: Sequence[tuple[str, str]],
    ) -> None:
        events = Counter(
            "sluicegate_kv_events",
            "KV event batches of a backend's engine by outcome: applied, replayed (fetched "
            "after a gap), malformed (dropped); and gaps in its sequence and resets of its "
            "index (a gap no replay filled, a restart, a disconnect, a malformed batch).",
            ["model", "backend", "outcome"],
            registry=registry,
        )
        self._children = {
            (model, backend, outcome): events.labels(model, backend, outcome)
            for model, backend in backends
            for outcome in OUTCOMES
        }
        registry.register(_IndexGauge(scheduler, backends))

    def count(self, model: str, backend: str, outcome: Outcome) -> None:
        """One more ``outcome`` for a backend's stream."""
        self._children[(model, backend, outcome)].inc()


class _IndexGauge(Collector):
    """``sluicegate_kv_index_blocks``: the blocks each subscribed backend's index holds."""

    def __init__(self, scheduler: Scheduler, backends: Sequence[tuple[str, str]]) -> None:
        self._scheduler = scheduler
        self._backends = frozenset(backends)
        self._models = sorted({model for model, _ in backends})

    def collect(self) -> Iterator[GaugeMetricFamily]:
        family = GaugeMetricFamily(
            "sluicegate_kv_index_blocks",
            "KV blocks a backend's engine holds, as its KV events say (at most max_blocks).",
            labels=["model", "backend"],
        )
        for model in self._models:
            for backend in self._scheduler.view(model).backends:
                if (model, backend.name) in self._backends:
                    family.add_metric([model, backend.name], backend.kv_index_blocks or 0)
        yield family
