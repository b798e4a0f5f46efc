"""Distributed mode's metrics: the store link's mode and the global view it last saw."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from sluicegate.core.views import tenant_totals
from sluicegate.gateway.distributed.link_view import LinkView
from sluicegate.store.types import GlobalCounts

LINK_MODES = ("global", "rejoining", "fail_open", "fail_closed")
"""Every mode ``sluicegate_store_mode`` has a sample for."""

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
    ``sluicegate_store_round_trip_seconds{op}`` (``sync``, ``take``, ``heartbeat``,
    ``work``).

    With ``view`` (the link's ``LinkView``), also ``sluicegate_store_mode{mode}`` (1 for
    the mode the link is in, 0 for the others), ``sluicegate_store_last_sync_age_seconds``
    and ``sluicegate_store_last_sync_round_trip_seconds`` (none before the first sync), and,
    unless ``exposed_tenant`` is ``None`` (``server.metrics_tenant_label: none``),
    ``sluicegate_store_global_tenant_running{model,tenant}``: the store's running requests
    per tenant as last read (``LinkView.read_tenants``), only while the link is global.
    """

    def __init__(
        self,
        registry: CollectorRegistry,
        *,
        is_global: Callable[[], bool],
        replicas: Callable[[], int],
        counts: Callable[[], Mapping[str, GlobalCounts]],
        view: LinkView | None = None,
        exposed_tenant: Callable[[str], tuple[str, ...]] | None = None,
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
        if view is not None:
            registry.register(_ViewGauges(view, is_global, exposed_tenant))


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


class _ViewGauges(Collector):
    """The link's mode, its last sync and the store's running requests per tenant, read at
    scrape time from its ``LinkView``."""

    def __init__(
        self,
        view: LinkView,
        is_global: Callable[[], bool],
        exposed_tenant: Callable[[str], tuple[str, ...]] | None,
    ) -> None:
        self._view = view
        self._is_global = is_global
        self._exposed = exposed_tenant

    def collect(self) -> Iterator[GaugeMetricFamily]:
        """Yield the gauges."""
        view = self._view
        mode = GaugeMetricFamily(
            "sluicegate_store_mode",
            "1 for the store link's mode (global, rejoining, fail_open, fail_closed), else 0.",
            labels=["mode"],
        )
        for name in LINK_MODES:
            mode.add_metric([name], 1.0 if view.mode == name else 0.0)
        yield mode
        age = view.sync_age_s()
        if age is not None and view.sync_round_trip_s is not None:
            yield GaugeMetricFamily(
                "sluicegate_store_last_sync_age_seconds",
                "Seconds since this replica's last successful sync with the store.",
                value=age,
            )
            yield GaugeMetricFamily(
                "sluicegate_store_last_sync_round_trip_seconds",
                "The round trip of this replica's last successful sync with the store.",
                value=view.sync_round_trip_s,
            )
        if self._exposed is None:
            return
        family = GaugeMetricFamily(
            "sluicegate_store_global_tenant_running",
            "Requests running on every replica per tenant (configured tenants; others are "
            "'other'), as last read from the store's leases (while in global mode).",
            labels=["model", "tenant"],
        )
        if view.tenants is not None and self._is_global():
            for model, counts in view.tenants.items():
                for tenant, count in tenant_totals(counts, view.configured).items():
                    family.add_metric([model, *self._exposed(tenant)], count)
        yield family
