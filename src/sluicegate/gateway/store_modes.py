"""The store link's vocabulary: its modes, what it calls back on the driver, its timings,
and the conversions of tenants' limits it needs (``gateway/store_link.py``)."""

from __future__ import annotations

import enum
from typing import Protocol

from sluicegate.core.ratelimit import TenantRateLimiter
from sluicegate.core.spec import TenantSpec
from sluicegate.core.ticket import TicketId
from sluicegate.store.types import TenantRates

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


def distinct_replicas(sessions: set[str]) -> int:
    """How many replicas hold these session ids (``<replica>.<n>``), at least 1."""
    return max(1, len({session.rpartition(".")[0] or session for session in sessions}))


def tenant_rates(tenant: TenantSpec) -> TenantRates:
    """The tenant's buckets as ``core/ratelimit.py`` builds them."""
    rps = tenant.requests_per_s
    per_min = tenant.tokens_per_min
    return TenantRates(
        tenant.name,
        rps,
        tenant.burst_requests if tenant.burst_requests is not None else max(1.0, rps or 1.0),
        None if per_min is None else per_min / 60.0,
        tenant.burst_tokens if tenant.burst_tokens is not None else (per_min or 1.0),
    )


def scaled_tenant(tenant: TenantSpec, share: float) -> TenantSpec:
    """``tenant`` with ``share`` of its rates and bursts (bursts at least 1)."""
    update: dict[str, float | None] = {}
    if tenant.requests_per_s is not None:
        update["requests_per_s"] = tenant.requests_per_s * share
        burst = tenant.burst_requests or max(1.0, tenant.requests_per_s)
        update["burst_requests"] = max(1.0, burst * share)
    if tenant.tokens_per_min is not None:
        update["tokens_per_min"] = tenant.tokens_per_min * share
        burst_tokens = tenant.burst_tokens or tenant.tokens_per_min
        update["burst_tokens"] = max(1.0, burst_tokens * share)
    return tenant.model_copy(update=update)
