"""Random routing: a seeded draw among the available backends, weighted by weight."""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import ClassVar

from sluicegate.core.backend_state import BackendState
from sluicegate.core.component_specs import PrefixRoutingSpec
from sluicegate.core.ticket import Ticket


class RandomRouter:
    """Sends each ticket to an available backend drawn at random, with probability
    ``weight / Σ weight`` over the available ones; load and prefixes are ignored.

    The baseline that routing studies compare against (llm-d's precise prefix-cache
    benchmark reports ``random`` beside its scorers). The draws come from a
    ``random.Random(seed)`` of the router's own, so a run is reproducible: the same
    backends and the same sequence of calls give the same choices.
    """

    name: ClassVar[str] = "random"

    def __init__(
        self,
        backends: Sequence[BackendState],
        prefix_routing: PrefixRoutingSpec | None = None,
        *,
        seed: int = 0,
    ) -> None:
        self._rng = random.Random(seed)

    def choose(
        self, ticket: Ticket, service_s: float, backends: Sequence[BackendState], now: float
    ) -> BackendState | None:
        """A weighted random available backend, or ``None`` when none is available."""
        available = [b for b in backends if b.available(now, ticket.units)]
        if not available:
            return None
        total = sum(b.spec.weight for b in available)
        point = self._rng.random() * total
        for backend in available:
            point -= backend.spec.weight
            if point < 0.0:
                return backend
        return available[-1]  # float rounding left ``point`` at exactly 0
