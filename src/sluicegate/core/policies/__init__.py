"""Lane queue policies: orderings and fairness, registered by name (DESIGN §6).

A lane's ``policy`` names its ordering — ``fifo``, ``priority``, ``sjf``,
``slack``, and for simulation ``oracle`` (sjf with true output lengths) and
``slack-oracle`` (slack with true lengths) — and its ``fairness`` names how
tenants share it: ``none`` or ``vtc``. ``policy: fair`` is kept as a name for
``vtc`` fairness with ``slack`` ordering, which is what it has always meant.
"""

from __future__ import annotations

from collections.abc import Mapping

from sluicegate.core.fair_queue import FairQueue
from sluicegate.core.policies.fifo import FifoOrdering
from sluicegate.core.policies.oracle import OracleOrdering
from sluicegate.core.policies.policy import FairnessFactory, Ordering, single_flow
from sluicegate.core.policies.priority import PriorityOrdering
from sluicegate.core.policies.sjf import ShortestJobOrdering
from sluicegate.core.policies.slack import SlackOrdering
from sluicegate.core.policies.slack_oracle import SlackOracleOrdering
from sluicegate.core.queues import LaneQueue
from sluicegate.core.registry import Registry

__all__ = [
    "FAIRNESS",
    "ORDERINGS",
    "POLICY_ALIASES",
    "FairnessFactory",
    "Ordering",
    "make_queue",
    "policy_names",
    "queue_policies",
    "resolve_policy",
    "simulation_only_policies",
]

ORDERINGS: Registry[type[Ordering]] = Registry(
    "ordering",
    (
        (ordering.name, ordering)
        for ordering in (
            FifoOrdering,
            PriorityOrdering,
            ShortestJobOrdering,
            SlackOrdering,
            OracleOrdering,
            SlackOracleOrdering,
        )
    ),
)
"""Which ticket of a flow goes first."""

FAIRNESS: Registry[FairnessFactory] = Registry(
    "fairness", (("none", single_flow), ("vtc", FairQueue))
)
"""Which flow (tenant) goes first."""

POLICY_ALIASES: Mapping[str, tuple[str, str]] = {"fair": ("slack", "vtc")}
"""Policy names that stand for an (ordering, fairness) pair."""


def policy_names() -> frozenset[str]:
    """Every name ``LaneSpec.policy`` accepts: the orderings and the aliases."""
    return ORDERINGS.names() | POLICY_ALIASES.keys()


def simulation_only_policies() -> frozenset[str]:
    """Names of the policies only ``sluicegate simulate`` can run (they need true lengths)."""
    return frozenset(name for name in ORDERINGS if ORDERINGS.get(name).simulation_only)


def resolve_policy(policy: str, fairness: str | None) -> tuple[str, str]:
    """The (ordering, fairness) a lane's ``policy`` and ``fairness`` settings mean.

    ``fairness`` ``None`` means the policy's own: ``vtc`` for ``fair``, else ``none``.

    Raises:
        ValueError: a name is not registered, or ``fairness`` contradicts an alias.
    """
    alias = POLICY_ALIASES.get(policy)
    if alias is not None:
        ordering, implied = alias
        if fairness is not None and fairness != implied:
            raise ValueError(
                f"policy {policy!r} is {ordering!r} ordering with {implied!r} fairness, "
                f"so it cannot take fairness {fairness!r}; "
                f"write policy: {ordering} with fairness: {fairness}"
            )
        return alias
    if policy not in ORDERINGS.names():
        raise ValueError(f"unknown policy {policy!r}; choose one of {sorted(policy_names())}")
    fairness = "none" if fairness is None else fairness
    if fairness not in FAIRNESS.names():
        raise ValueError(FAIRNESS.unknown(fairness))
    return policy, fairness


def queue_policies() -> list[tuple[str, str]]:
    """Every (ordering, fairness) pair a lane can use, in name order."""
    return [(ordering, fairness) for ordering in ORDERINGS for fairness in FAIRNESS]


def make_queue(
    ordering: str, fairness: str, *, aging: float, weights: Mapping[str, float]
) -> LaneQueue:
    """A lane's queue: ``fairness`` between tenants, ``ordering`` within each.

    Args:
        ordering: A registered ordering name.
        fairness: A registered fairness name.
        aging: The lane's ``aging`` (read by ``sjf`` and ``oracle``).
        weights: The tenants' fair-share weights (read by ``vtc``).

    Raises:
        KeyError: an unregistered name; the message lists the choices.
    """
    key = ORDERINGS.get(ordering)(aging).key
    return FAIRNESS.get(fairness)(key, weights)
