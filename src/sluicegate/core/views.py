"""Read-only snapshots of scheduler state, for admin endpoints, metrics and tests."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import NamedTuple

from sluicegate.core.runtime import ModelRuntime
from sluicegate.core.ticket import Ticket

OTHER_TENANT = "other"
"""The bucket every tenant that is not configured by name is shown and labelled under."""


@dataclass(frozen=True, slots=True)
class LaneView:
    """One lane: queue depth, running counts and cap."""

    name: str
    queued: int
    own: int
    borrowed: int
    cap: int
    max_queue: int
    policy: str
    tightened: bool = False

    @property
    def running(self) -> int:
        """Own plus borrowed running tickets."""
        return self.own + self.borrowed


@dataclass(frozen=True, slots=True)
class BackendView:
    """One backend: own in-flight count, health and what its engine last reported.

    ``healthy`` is whether it takes traffic at the view's time (``BackendState.healthy``);
    ``circuit`` is the circuit's state at that time. ``metrics_age_s``: seconds since its
    engine's metrics were last scraped well (None: never); ``metrics_stale``: too long
    (``ModelSpec.metrics_stale_after_s``), so it counts as full. ``kv_index_blocks``:
    the blocks its engine holds as its KV events say (None: no events yet).
    """

    name: str
    inflight: int
    healthy: bool
    probe_healthy: bool
    circuit: str
    kv_cache_usage: float | None
    num_requests_waiting: int | None
    num_requests_running: int | None
    metrics_age_s: float | None
    metrics_stale: bool
    kv_index_blocks: int | None


@dataclass(frozen=True, slots=True)
class ModelView:
    """One model: lanes, backends, running count, effective cap and token budget use."""

    name: str
    running: int
    cap: int
    configured_cap: int
    floor: int
    inflight_tokens: int
    max_inflight_tokens: int | None
    lanes: tuple[LaneView, ...]
    backends: tuple[BackendView, ...]

    @property
    def queued(self) -> int:
        """Tickets waiting in all lanes."""
        return sum(lane.queued for lane in self.lanes)


def view_model(model: ModelRuntime, now: float) -> ModelView:
    """Snapshot ``model`` as it stands at ``now``."""
    return ModelView(
        name=model.spec.name,
        running=model.running,
        cap=model.cap(),
        configured_cap=model.spec.max_concurrency,
        floor=model.spec.max_concurrency if model.limit is None else model.limit.spec.floor,
        inflight_tokens=model.inflight_tokens,
        max_inflight_tokens=model.token_budget,
        lanes=tuple(
            LaneView(
                name=lane.spec.name,
                queued=len(lane.queue),
                own=lane.own,
                borrowed=lane.borrowed,
                cap=lane.cap,
                max_queue=lane.spec.max_queue,
                policy=lane.spec.policy,
                tightened=lane.ceiling is not None,
            )
            for lane in model.lane_order
        ),
        backends=tuple(
            BackendView(
                name=backend.spec.name,
                inflight=backend.inflight,
                healthy=backend.healthy(now),
                probe_healthy=backend.probe_healthy,
                circuit=backend.circuit.state_at(now).value,
                kv_cache_usage=backend.kv_cache_usage,
                num_requests_waiting=backend.num_requests_waiting,
                num_requests_running=backend.num_requests_running,
                metrics_age_s=None if backend.metrics_at is None else now - backend.metrics_at,
                metrics_stale=backend.metrics_stale(now),
                kv_index_blocks=None if backend.kv_index is None else len(backend.kv_index),
            )
            for backend in model.backends
        ),
    )


class RunningLease(NamedTuple):
    """A running ticket as distributed mode writes it back to a returning store.

    Attributes:
        ticket: the ticket.
        cost_tokens: its share of the in-flight token budget.
        preemptible_in_s: how long until it may be preempted (0: now); ``None``: never.
        borrowed: it runs on quota borrowed from a lending lane.
    """

    ticket: Ticket
    cost_tokens: int
    preemptible_in_s: float | None
    borrowed: bool


def tenants_running(model: ModelRuntime) -> dict[tuple[str, str], int]:
    """Running requests of ``model`` per (tenant, lane), as ``store/scripts/counts.lua`` counts
    the store's leases: a request counts once, whatever its ``n`` choices (its units)."""
    counts: dict[tuple[str, str], int] = {}
    for entry in model.running_entries.values():
        key = (entry.ticket.tenant, entry.ticket.lane)
        counts[key] = counts.get(key, 0) + 1
    return counts


def tenant_bucket(tenant: str, configured: Collection[str]) -> str:
    """The tenant as shown and labelled: its name if configured, else ``OTHER_TENANT``."""
    return tenant if tenant in configured else OTHER_TENANT


def by_tenant(
    counts: Mapping[tuple[str, str], int], configured: Collection[str]
) -> dict[str, dict[str, int]]:
    """(tenant, lane) counts as tenant bucket → lane → count (``tenant_bucket``), zeros left out."""
    found: dict[str, dict[str, int]] = {}
    for (tenant, lane), count in counts.items():
        if count > 0:
            lanes = found.setdefault(tenant_bucket(tenant, configured), {})
            lanes[lane] = lanes.get(lane, 0) + count
    return found


def tenant_totals(
    counts: Mapping[tuple[str, str], int], configured: Collection[str]
) -> dict[str, int]:
    """(tenant, lane) counts summed per tenant bucket, what a gauge per tenant exposes: every
    configured tenant (0 when idle), and ``OTHER_TENANT`` when it runs anything or when no
    tenant is configured (an open gateway's requests are all ``other``)."""
    totals = dict.fromkeys(sorted(configured), 0)
    if not configured:
        totals[OTHER_TENANT] = 0
    for tenant, lanes in by_tenant(counts, configured).items():
        totals[tenant] = totals.get(tenant, 0) + sum(lanes.values())
    return totals
