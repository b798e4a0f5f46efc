"""Prefix affinity: consistent hashing of the prompt prefix with bounded loads."""

from __future__ import annotations

import bisect
import hashlib
import math
from collections.abc import Sequence
from typing import ClassVar

from sluicegate.core.backend_state import BackendState
from sluicegate.core.component_specs import PrefixRoutingSpec
from sluicegate.core.routing.least_inflight import LeastInflightRouter
from sluicegate.core.ticket import Ticket


def _point(data: str) -> int:
    """A stable 64-bit ring position (Python's ``hash`` of a str is salted per process)."""
    return int.from_bytes(hashlib.blake2b(data.encode(), digest_size=8).digest(), "big")


class PrefixAffinityRouter:
    """Keeps requests that share a prompt prefix on one backend, so its prefix cache hits.

    Each backend owns ``max(1, round(vnodes_per_weight * weight))`` points on a
    hash ring (``blake2b(f"{name}#{i}")``). A ticket's ``prefix_key`` hashes to
    a point; the router walks clockwise from it and takes the first available
    backend whose load stays within the bound of *consistent hashing with
    bounded loads* (Mirrokni, Thorup, Zadimoghaddam 2018)::

        inflight + 1 <= ceil(c * (total_inflight + 1) / n_available)

    where ``total_inflight`` sums over the ``n_available`` available backends
    and ``c = load_factor``. So no backend runs more than about ``c`` times the
    mean, however skewed the keys, and a key moves only when its home backend
    is unavailable or over the bound. Tickets without a ``prefix_key`` (and the
    unreachable case where nothing qualifies) go to least in-flight.
    """

    name: ClassVar[str] = "prefix_affinity"

    def __init__(
        self,
        backends: Sequence[BackendState],
        prefix_routing: PrefixRoutingSpec | None = None,
        *,
        load_factor: float = 1.25,
        vnodes_per_weight: int = 100,
    ) -> None:
        if load_factor < 1.0:
            raise ValueError(f"load_factor must be >= 1.0, got {load_factor}")
        if vnodes_per_weight < 1:
            raise ValueError(f"vnodes_per_weight must be >= 1, got {vnodes_per_weight}")
        self._load_factor = load_factor
        self._vnodes_per_weight = vnodes_per_weight
        self._fallback = LeastInflightRouter(backends)
        self._signature: tuple[tuple[str, float], ...] = ()
        self._points: list[int] = []
        self._owners: list[str] = []
        self._rebuild(backends)

    def _rebuild(self, backends: Sequence[BackendState]) -> None:
        """Lay out the ring for ``backends`` (only when their names or weights change)."""
        self._signature = tuple((b.name, b.spec.weight) for b in backends)
        ring = sorted(
            (_point(f"{name}#{i}"), name)
            for name, weight in self._signature
            for i in range(max(1, round(self._vnodes_per_weight * weight)))
        )
        self._points = [point for point, _ in ring]
        self._owners = [name for _, name in ring]

    def choose(
        self, ticket: Ticket, service_s: float, backends: Sequence[BackendState], now: float
    ) -> BackendState | None:
        """The first backend clockwise from the ticket's prefix that is under the load bound."""
        if ticket.prefix_key is None:
            return self._fallback.choose(ticket, service_s, backends, now)
        if tuple((b.name, b.spec.weight) for b in backends) != self._signature:
            self._rebuild(backends)
        available = {b.name: b for b in backends if b.available(now, ticket.units)}
        if not available:
            return None
        total = sum(b.inflight for b in available.values())
        bound = math.ceil(self._load_factor * (total + 1) / len(available))
        chosen = self._walk(_point(str(ticket.prefix_key)), available, bound)
        if chosen is None:
            return self._fallback.choose(ticket, service_s, backends, now)
        return chosen

    def _walk(
        self, start: int, available: dict[str, BackendState], bound: int
    ) -> BackendState | None:
        """Clockwise from ``start``: the first available backend with ``inflight < bound``."""
        size = len(self._points)
        first = bisect.bisect_right(self._points, start)
        seen: set[str] = set()
        for step in range(size):
            owner = self._owners[(first + step) % size]
            if owner in seen:
                continue
            seen.add(owner)
            backend = available.get(owner)
            if backend is not None and backend.inflight + 1 <= bound:
                return backend
            if len(seen) == len(self._signature):
                break
        return None
