"""Least in-flight routing: the backend with the fewest running requests per unit weight."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import ClassVar

from sluicegate.core.backend_state import BackendState
from sluicegate.core.component_specs import PrefixRoutingSpec
from sluicegate.core.ticket import Ticket


def pick_min(
    candidates: Sequence[BackendState], score: Callable[[BackendState], float], start: int
) -> BackendState | None:
    """The candidate with the smallest ``score``; ties go to the first at or after ``start``.

    Scanning from a rotating ``start`` makes equal candidates take turns instead
    of the first one in configuration order always winning.

    Args:
        candidates: backends to choose among (already filtered to available ones).
        score: smaller is better.
        start: index (taken modulo ``len(candidates)``) where the scan begins.

    Returns:
        The chosen backend, or ``None`` when ``candidates`` is empty.
    """
    n = len(candidates)
    best: BackendState | None = None
    best_score = 0.0
    for offset in range(n):
        backend = candidates[(start + offset) % n]
        value = score(backend)
        if best is None or value < best_score:
            best, best_score = backend, value
    return best


def inflight_per_weight(backend: BackendState) -> float:
    """Load of ``backend`` relative to its capacity share: ``inflight / weight``."""
    return backend.inflight / backend.spec.weight


class LeastInflightRouter:
    """Sends each ticket to the available backend with the smallest ``inflight / weight``.

    Ties are broken by a cursor that advances on every choice, so backends with
    equal load alternate (round robin among the tied ones).
    """

    name: ClassVar[str] = "least_inflight"

    def __init__(
        self, backends: Sequence[BackendState], prefix_routing: PrefixRoutingSpec | None = None
    ) -> None:
        self._cursor = 0

    def choose(
        self, ticket: Ticket, service_s: float, backends: Sequence[BackendState], now: float
    ) -> BackendState | None:
        """The available backend with the least in-flight work per weight, or ``None``."""
        n = len(backends)
        start = self._cursor
        self._cursor = start + 1
        best: BackendState | None = None
        best_score = 0.0
        # Hand-inlined scan: this runs on every admission (see benchmarks/bench_core.py).
        for offset in range(n):
            backend = backends[(start + offset) % n]
            score = backend.inflight / backend.spec.weight
            if (best is None or score < best_score) and backend.available(now, ticket.units):
                best, best_score = backend, score
        return best
