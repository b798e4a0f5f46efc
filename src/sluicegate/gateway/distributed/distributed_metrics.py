"""Distributed mode's metrics: the store link's mode and the global view it last saw."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from sluicegate.store.types import GlobalCounts

STORE_RTT_BUCKETS = (
    0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0,
)  # fmt: skip


class StoreMetrics:
    """``sluicegate_store_*`` metrics, registered in the gateway's registry.

    Gauges (read at scrape time): ``sluicegate_store_global`` (1 while the
    shared store admits, 0 in a fallback), ``sluicegate_store_replicas`` (live
    replicas last seen), and per model ``sluicegate_store_global_running``,
    ``sluicegate_store_global_waiting``, ``sluicegate_store_global_inflight_tokens``
    (the store's counts after this replica's last sync). Counters
    ``sluicegate_store_transitions_total{mode}`` and ``sluicegate_store_retries_total{op}``
    (a timed-out ``sync`` or ``take`` sent again, a ``grant listener`` that failed while the
    store still answered); histogram
    ``sluicegate_store_round_trip_seconds{op}`` (``sync``, ``take``, ``heartbeat``).
    """

    def __init__(
        self,
        registry: CollectorRegistry,
        *,
        is_global: Callable[[], bool],
        replicas: Callable[[], int],
        counts: Callable[[], Mapping[str, GlobalCounts]],
    ) -> None:
        self.transitions = Counter(
            "sluicegate_store_transitions",
            "Changes of the store link's mode (global, fail_open, fail_closed).",
            ["mode"],
            registry=registry,
        )
        self.retries = Counter(
            "sluicegate_store_retries",
            "Store calls retried instead of falling back (the store still answered).",
            ["op"],
            registry=registry,
        )
        self.round_trip = Histogram(
            "sluicegate_store_round_trip_seconds",
            "Round trips to the shared store.",
            ["op"],
            buckets=STORE_RTT_BUCKETS,
            registry=registry,
        )
        registry.register(_StoreGauges(is_global, replicas, counts))


class _StoreGauges(Collector):
    """The link's mode and the global counts, read at scrape time."""

    def __init__(
        self,
        is_global: Callable[[], bool],
        replicas: Callable[[], int],
        counts: Callable[[], Mapping[str, GlobalCounts]],
    ) -> None:
        self._is_global = is_global
        self._replicas = replicas
        self._counts = counts

    def collect(self) -> Iterator[GaugeMetricFamily]:
        """Yield the gauges."""
        yield GaugeMetricFamily(
            "sluicegate_store_global",
            "1 while the shared store admits, 0 while this replica falls back.",
            value=1.0 if self._is_global() else 0.0,
        )
        yield GaugeMetricFamily(
            "sluicegate_store_replicas",
            "Live gateway replicas, as last seen in the store.",
            value=float(self._replicas()),
        )
        families = {
            "running": GaugeMetricFamily(
                "sluicegate_store_global_running",
                "Requests holding a global slot (store's count at this replica's last sync).",
                labels=["model"],
            ),
            "waiting": GaugeMetricFamily(
                "sluicegate_store_global_waiting",
                "Requests in the global waiting sets (at this replica's last sync).",
                labels=["model"],
            ),
            "tokens": GaugeMetricFamily(
                "sluicegate_store_global_inflight_tokens",
                "Tokens of the requests holding global slots (at this replica's last sync).",
                labels=["model"],
            ),
        }
        for model, counts in self._counts().items():
            families["running"].add_metric([model], counts.running)
            families["waiting"].add_metric([model], counts.waiting)
            families["tokens"].add_metric([model], counts.inflight_tokens)
        yield from families.values()
