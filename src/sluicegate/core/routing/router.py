"""The router seam: pick a backend for a ticket among a model's backends."""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar, Protocol

from sluicegate.core.backend_state import BackendState
from sluicegate.core.component_specs import PrefixRoutingSpec
from sluicegate.core.ticket import Ticket


class Router(Protocol):
    """Chooses where an admitted ticket runs.

    Contract: ``choose`` returns one of ``backends`` for which
    ``available(now)`` is true, or ``None`` when none is. It may keep its own
    state (a round-robin cursor, a hash ring) but must not mutate the backends;
    the scheduler updates their in-flight counts after the choice. Given the
    same backends and the same sequence of calls, it makes the same choices.

    A Protocol rather than a base class: routers share no code or state, so
    there is nothing for a base to hold; ``RouterFactory`` states the one
    constructor they share.
    """

    name: ClassVar[str]

    def choose(
        self, ticket: Ticket, service_s: float, backends: Sequence[BackendState], now: float
    ) -> BackendState | None:
        """The backend for ``ticket`` (predicted service ``service_s``), or ``None``."""
        ...


class RouterFactory(Protocol):
    """What ``ROUTERS`` holds: a router class, built once per model with its backends and
    the model's ``prefix_routing`` settings (which only ``precise_prefix`` reads; every
    other router accepts and ignores them, so one factory call builds any strategy)."""

    @property
    def name(self) -> str:
        """The name ``ModelSpec.router`` uses for this strategy."""
        ...

    def __call__(
        self, backends: Sequence[BackendState], prefix_routing: PrefixRoutingSpec | None = None
    ) -> Router:
        """A router for ``backends`` (``prefix_routing`` None: the defaults)."""
        ...
