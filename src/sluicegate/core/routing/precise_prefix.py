"""Precise prefix routing: follow the engine that holds the longest run of a prompt's KV
blocks, as its KV events say, until its queued prefill would cost too much."""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

from sluicegate.core.backend_state import BackendState
from sluicegate.core.component_specs import PrefixRoutingSpec
from sluicegate.core.routing.least_inflight import LeastInflightRouter, inflight_per_weight
from sluicegate.core.routing.recent_routes import RecentRoutes
from sluicegate.core.ticket import Ticket


class PrecisePrefixRouter:
    """Sticky to the longest cached prefix until saturated (llm-d's default scorer mix).

    A backend's *cached prefix* for a ticket is the longest leading run of
    ``ticket.block_hashes`` each of which its engine holds (``BackendState.kv_index``,
    fed by KV events) or this router sent there within ``recent_ttl_s``
    (``RecentRoutes``: siblings land together before the engine has announced anything).

    Among the available backends, the one with the longest cached prefix (ties: lower
    ``inflight / weight``, then a rotating cursor) is followed when that prefix is not
    empty and its queued prefill stays within ``max_ttft_penalty_ms``::

        (prefill_backlog_tokens + uncached) / rate * 1000 <= max_ttft_penalty_ms

    where ``uncached`` is this ticket's prompt tokens beyond the cached blocks (of
    ``block_tokens``) and ``rate`` the spec's ``prefill_tokens_per_s``, else the rate the
    backend learned from times to first token (unknown rate or no penalty bound: always
    follow). Otherwise the ticket spills by load: least ``inflight / weight``, ties to
    the longer cached prefix, then the cursor. Every decision is recorded in the recent
    routes. A ticket without block hashes goes to least in-flight.
    """

    name: ClassVar[str] = "precise_prefix"

    def __init__(
        self, backends: Sequence[BackendState], prefix_routing: PrefixRoutingSpec | None = None
    ) -> None:
        self._spec = prefix_routing if prefix_routing is not None else PrefixRoutingSpec()
        self._recent = RecentRoutes(self._spec.recent_ttl_s)
        self._fallback = LeastInflightRouter(backends)
        self._cursor = 0

    def choose(
        self, ticket: Ticket, service_s: float, backends: Sequence[BackendState], now: float
    ) -> BackendState | None:
        """The backend holding the longest cached prefix unless saturated, else the least
        loaded; ``None`` when none is available."""
        hashes = ticket.block_hashes
        if not hashes:
            return self._fallback.choose(ticket, service_s, backends, now)
        available = [b for b in backends if b.available(now, ticket.units)]
        if not available:
            return None
        cached = [self.cached_blocks(hashes, b, now) for b in available]
        start = self._cursor
        self._cursor = start + 1
        n = len(available)
        order = [(start + offset) % n for offset in range(n)]
        sticky = min(order, key=lambda i: (-cached[i], inflight_per_weight(available[i])))
        if cached[sticky] and not self._saturated(available[sticky], ticket, cached[sticky]):
            chosen = available[sticky]
        else:
            chosen = available[
                min(order, key=lambda i: (inflight_per_weight(available[i]), -cached[i]))
            ]
        self._recent.record(hashes, chosen.name, now)
        return chosen

    def cached_blocks(self, hashes: Sequence[int], backend: BackendState, now: float) -> int:
        """How many leading ``hashes`` ``backend`` holds, by its KV events or by this
        router's recent decisions."""
        index, recent, name = backend.kv_index, self._recent, backend.name
        run = 0
        for block in hashes:
            if (index is None or block not in index) and not recent.holds(block, name, now):
                break
            run += 1
        return run

    def _saturated(self, backend: BackendState, ticket: Ticket, cached: int) -> bool:
        """Whether ``backend``'s queued prefill, with ``ticket``'s uncached part, would
        delay a first token by more than ``max_ttft_penalty_ms``."""
        bound_ms = self._spec.max_ttft_penalty_ms
        rate = self._spec.prefill_tokens_per_s or backend.prefill_tokens_per_s
        if bound_ms is None or rate is None:
            return False
        uncached = max(0, ticket.prompt_tokens - cached * self._spec.block_tokens)
        return (backend.prefill_backlog_tokens + uncached) / rate * 1000.0 > bound_ms
