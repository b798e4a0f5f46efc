"""Routing strategies: which backend of a model runs an admitted ticket.

Each strategy is one small class in its own module, registered by name in
:data:`ROUTERS`; importing this package registers them all.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import cast

from sluicegate.core.backend import BackendState
from sluicegate.core.routing.base import ROUTERS, Router, RouterFactory
from sluicegate.core.routing.least_expected_time import LeastExpectedTimeRouter
from sluicegate.core.routing.least_inflight import LeastInflightRouter
from sluicegate.core.routing.prefix_affinity import PrefixAffinityRouter
from sluicegate.core.routing.round_robin import RoundRobinRouter

__all__ = [
    "ROUTERS",
    "LeastExpectedTimeRouter",
    "LeastInflightRouter",
    "PrefixAffinityRouter",
    "RoundRobinRouter",
    "Router",
    "RouterFactory",
    "make_router",
    "router_names",
]


def router_names() -> frozenset[str]:
    """Names of all registered routing strategies (valid values of ``ModelSpec.router``)."""
    return ROUTERS.names()


def make_router(name: str, backends: Sequence[BackendState]) -> Router:
    """A new router of strategy ``name`` for ``backends``.

    Raises:
        KeyError: ``name`` is not registered; the message lists the choices.
    """
    factory = cast(RouterFactory, ROUTERS.get(name))
    return factory(backends)
