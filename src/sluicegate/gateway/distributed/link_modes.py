"""The store link's vocabulary: its modes, what it calls back on the driver, its timings,
and the conversions of tenants' limits it needs (``gateway/distributed/store_link.py``)."""

from __future__ import annotations

import enum
from typing import Protocol

from sluicegate.core.ratelimit import TenantRateLimiter, tenant_buckets
from sluicegate.core.spec import TenantSpec
from sluicegate.core.ticket import TicketId
from sluicegate.core.views import RunningLease
from sluicegate.store.types import Lease, TenantRates

PROBE_INTERVAL_S = 0.5
"""How often a replica in a fallback asks whether the store is back."""
HEARTBEAT_MAX_S = 0.5
"""The longest period between heartbeats (each also fills every model): a lease TTL / 4
when shorter."""
REJOIN_POLL_S = 0.05
"""How often a returning replica checks whether the others have rejoined."""
MAX_OPS_PER_SYNC = 256
"""Most operations one sync round trip carries (about 10 ms of Lua at the worst)."""
GRANT_BLOCK_S = 1.0
"""How long one blocking pop of the grant lists waits."""
WORK_PERIOD_S = 0.1
"""How often a replica with shedding lanes publishes its work summary and reads the
others' (``gateway/distributed/work_sharing.py``)."""
STOP_PREFIX = "!"
"""Marks a stop on a grant list: ``!<ticket>`` (ticket ids are hex, never start with it)."""


class LinkMode(enum.Enum):
    """Who admits: the shared store, or this replica alone after the store failed."""

    GLOBAL = "global"
    FAIL_OPEN = "fail_open"
    FAIL_CLOSED = "fail_closed"


class StoreClient(Protocol):
    """What the link calls back on the driver."""

    def granted(self, model: str, ticket_id: TicketId) -> None:
        """The store granted a global slot to one of this replica's tickets."""
        ...

    def store_lost(self, *, fail_open: bool, share: float, limiter: TenantRateLimiter) -> None:
        """The store failed: fall back."""
        ...

    def store_restored(self) -> None:
        """The store is back: offer every queued ticket again."""
        ...

    def stop(self, ticket_id: TicketId) -> None:
        """The store chose a running ticket of this replica as a preemption victim."""
        ...

    def now(self) -> float:
        """The scheduler's clock (wall-anchored in distributed mode)."""
        ...


def distinct_replicas(sessions: set[str]) -> int:
    """How many replicas hold these session ids (``<replica>.<n>``), at least 1."""
    return max(1, len({session.rpartition(".")[0] or session for session in sessions}))


def tenant_rates(tenant: TenantSpec) -> TenantRates:
    """The tenant's buckets as ``core/ratelimit.py`` builds them, for the store."""
    requests, tokens = tenant_buckets(tenant)
    return TenantRates(
        tenant.name,
        None if requests is None else requests.rate_per_s,
        1.0 if requests is None else requests.burst,
        None if tokens is None else tokens.rate_per_s,
        1.0 if tokens is None else tokens.burst,
    )


def store_lease(running: RunningLease, weight: float, *, counted: bool) -> Lease:
    """A running ticket as ``resync`` writes it back to a returning store; ``counted``: its
    lane gives tenants their shares back."""
    ticket = running.ticket
    return Lease(
        ticket.id,
        ticket.lane,
        ticket.tenant,
        weight,
        running.cost_tokens,
        ticket.priority,
        running.preemptible_in_s,
        running.borrowed,
        counted,
    )
