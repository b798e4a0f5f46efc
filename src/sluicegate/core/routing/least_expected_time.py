"""Least expected completion time: own predicted work plus the engine's queue and KV pressure."""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

from sluicegate.core.backend_state import BackendState
from sluicegate.core.component_specs import PrefixRoutingSpec
from sluicegate.core.routing.least_inflight import inflight_per_weight, pick_min
from sluicegate.core.ticket import Ticket

MAX_KV_USAGE = 0.95
"""KV usage is capped here so a full cache inflates the estimate 20x rather than infinitely."""


def expected_completion_s(backend: BackendState, service_s: float) -> float:
    """Expected time until a new request of ``service_s`` would finish on ``backend``.

    Formula::

        per_req  = predicted_work_s / inflight   if inflight > 0 else service_s
        queued   = predicted_work_s + num_requests_waiting * per_req
        pressure = 1 / (1 - min(kv_cache_usage, 0.95))   (1 when usage is unknown)
        E[T]     = queued * pressure / weight + service_s

    ``num_requests_waiting`` counts as 0 when not scraped.

    Args:
        backend: the candidate backend.
        service_s: predicted service time of the request being routed.

    Returns:
        The estimate in seconds.
    """
    per_request_s = (
        backend.predicted_work_s / backend.inflight if backend.inflight > 0 else service_s
    )
    waiting = backend.num_requests_waiting or 0
    queued_s = backend.predicted_work_s + waiting * per_request_s
    pressure = 1.0
    if backend.kv_cache_usage is not None:
        usage = min(max(backend.kv_cache_usage, 0.0), MAX_KV_USAGE)
        pressure = 1.0 / (1.0 - usage)
    return queued_s * pressure / backend.spec.weight + service_s


class LeastExpectedTimeRouter:
    """Sends each ticket where it is expected to finish soonest.

    Minimises :func:`expected_completion_s` over the available backends:
    ``(predicted_work_s + num_requests_waiting * per_req) / (1 - min(kv, 0.95))
    / weight + service_s``, with ``per_req = predicted_work_s / inflight`` (or
    the ticket's ``service_s`` when idle). Exact ties fall to the lower
    ``inflight / weight`` and then to a rotating cursor, so idle backends alternate.
    """

    name: ClassVar[str] = "least_expected_time"

    def __init__(
        self, backends: Sequence[BackendState], prefix_routing: PrefixRoutingSpec | None = None
    ) -> None:
        self._cursor = 0

    def choose(
        self, ticket: Ticket, service_s: float, backends: Sequence[BackendState], now: float
    ) -> BackendState | None:
        """The available backend with the smallest expected completion time, or ``None``."""
        available = [b for b in backends if b.available(now, ticket.units)]
        if not available:
            return None
        soonest = min(expected_completion_s(b, service_s) for b in available)
        tied = [b for b in available if expected_completion_s(b, service_s) == soonest]
        chosen = pick_min(tied, inflight_per_weight, self._cursor)
        self._cursor += 1
        return chosen
