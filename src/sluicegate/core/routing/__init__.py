"""Routing strategies: which backend of a model runs an admitted ticket (DESIGN §8).

Each strategy is one small class in its own module; ``ROUTERS`` lists them
all by the name ``ModelSpec.router`` takes.
"""

from __future__ import annotations

from collections.abc import Sequence

from sluicegate.core.backend_state import BackendState
from sluicegate.core.component_specs import PrefixRoutingSpec
from sluicegate.core.registry import Registry
from sluicegate.core.routing.least_expected_time import LeastExpectedTimeRouter
from sluicegate.core.routing.least_inflight import LeastInflightRouter
from sluicegate.core.routing.precise_prefix import PrecisePrefixRouter
from sluicegate.core.routing.prefix_affinity import PrefixAffinityRouter
from sluicegate.core.routing.random_pick import RandomRouter
from sluicegate.core.routing.round_robin import RoundRobinRouter
from sluicegate.core.routing.router import Router, RouterFactory

__all__ = [
    "ROUTERS",
    "LeastExpectedTimeRouter",
    "LeastInflightRouter",
    "PrecisePrefixRouter",
    "PrefixAffinityRouter",
    "RandomRouter",
    "RoundRobinRouter",
    "Router",
    "RouterFactory",
    "make_router",
    "router_names",
]

_STRATEGIES: tuple[RouterFactory, ...] = (
    RoundRobinRouter,
    LeastInflightRouter,
    LeastExpectedTimeRouter,
    PrefixAffinityRouter,
    PrecisePrefixRouter,
    RandomRouter,
)
ROUTERS: Registry[RouterFactory] = Registry("router", ((r.name, r) for r in _STRATEGIES))


def router_names() -> frozenset[str]:
    """Names of all registered routing strategies (valid values of ``ModelSpec.router``)."""
    return ROUTERS.names()


def make_router(
    name: str, backends: Sequence[BackendState], prefix_routing: PrefixRoutingSpec | None = None
) -> Router:
    """A new router of strategy ``name`` for ``backends``, with the model's
    ``prefix_routing`` settings (None: the defaults; only ``precise_prefix`` reads them).

    Raises:
        KeyError: ``name`` is not registered; the message lists the choices.
    """
    return ROUTERS.get(name)(backends, prefix_routing)
