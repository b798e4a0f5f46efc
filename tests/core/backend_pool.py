"""Backends and tickets for router tests: real ``BackendState``s with real circuit breakers."""

from __future__ import annotations

from collections.abc import Sequence

from sluicegate.core.backend_state import BackendState
from sluicegate.core.circuit import CircuitBreaker
from sluicegate.core.routing import Router
from sluicegate.core.spec import BackendSpec
from sluicegate.core.ticket import Ticket, TicketId

NOW = 1.0
SERVICE_S = 2.0


def backend(name: str, weight: float = 1.0, *, max_concurrency: int | None = None) -> BackendState:
    """A healthy, idle backend."""
    spec = BackendSpec(name=name, weight=weight, max_concurrency=max_concurrency)
    return BackendState(spec, CircuitBreaker(failures=3, cooldown_s=5.0))


def backends(n: int) -> list[BackendState]:
    """``n`` healthy, idle, equally weighted backends ``b0`` … ``b{n-1}``."""
    return [backend(f"b{i}") for i in range(n)]


def ticket(prefix_key: int | None = None, n: int = 0) -> Ticket:
    """A ticket carrying ``prefix_key``."""
    return Ticket(
        id=TicketId(f"t{n}"),
        model="m",
        tenant="acme",
        lane="interactive",
        priority=2,
        prompt_tokens=100,
        max_tokens=64,
        arrival=0.0,
        prefix_key=prefix_key,
    )


def pick(router: Router, pool: Sequence[BackendState], prefix_key: int | None = 7) -> str | None:
    """The name of the backend ``router`` chooses for one ticket, or ``None``."""
    chosen = router.choose(ticket(prefix_key), SERVICE_S, pool, NOW)
    return None if chosen is None else chosen.name


def snapshot(pool: Sequence[BackendState]) -> list[tuple[object, ...]]:
    """Every field a router could be tempted to change."""
    return [
        (
            b.inflight,
            b.predicted_work_s,
            b.kv_cache_usage,
            b.num_requests_waiting,
            b.num_requests_running,
            b.probe_healthy,
            b.circuit.state,
        )
        for b in pool
    ]
