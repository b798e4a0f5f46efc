"""Smooth weighted round robin over the available backends."""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

from sluicegate.core.backend_state import BackendState
from sluicegate.core.component_specs import PrefixRoutingSpec
from sluicegate.core.ticket import Ticket


class RoundRobinRouter:
    """Nginx's smooth weighted round robin by ``spec.weight``.

    Each choice adds every available backend's weight ``w_i`` to its running
    score ``s_i``, picks the backend with the largest ``s_i`` (first in order
    on a tie) and subtracts ``W = Σ w_i`` (over the available backends) from
    the winner. Over any ``W`` consecutive choices with integer weights and a
    fixed available set, backend ``i`` is chosen exactly ``w_i`` times, and
    picks of a heavy backend are spread out rather than bunched. Unavailable
    backends keep their score until they return.
    """

    name: ClassVar[str] = "round_robin"

    def __init__(
        self, backends: Sequence[BackendState], prefix_routing: PrefixRoutingSpec | None = None
    ) -> None:
        self._score: dict[str, float] = {b.name: 0.0 for b in backends}

    def choose(
        self, ticket: Ticket, service_s: float, backends: Sequence[BackendState], now: float
    ) -> BackendState | None:
        """The next backend in the weighted rotation, or ``None`` if none is available."""
        best: BackendState | None = None
        best_score = 0.0
        total = 0.0
        for backend in backends:
            if not backend.available(now, ticket.units):
                continue
            score = self._score.get(backend.name, 0.0) + backend.spec.weight
            self._score[backend.name] = score
            total += backend.spec.weight
            if best is None or score > best_score:
                best, best_score = backend, score
        if best is not None:
            self._score[best.name] = best_score - total
        return best
