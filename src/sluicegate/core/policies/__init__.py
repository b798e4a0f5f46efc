"""Lane ordering policies, registered by name.

``fifo``, ``priority``, ``sjf``, ``slack``, ``fair``; and, for simulation, ``oracle``
(sjf with true output lengths) and ``slack-oracle`` (slack with true lengths).
"""

from __future__ import annotations

from collections.abc import Mapping

from sluicegate.core.policies import fair, fifo, oracle, priority, sjf, slack, slack_oracle
from sluicegate.core.policies.base import POLICIES, KeyedPolicy, Policy
from sluicegate.core.queues import LaneQueue
from sluicegate.core.spec import LaneSpec

__all__ = [
    "POLICIES",
    "KeyedPolicy",
    "Policy",
    "fair",
    "fifo",
    "make_queue",
    "oracle",
    "policy_names",
    "priority",
    "simulation_only_policies",
    "sjf",
    "slack",
    "slack_oracle",
]


def policy_names() -> frozenset[str]:
    """Names of every registered policy."""
    return POLICIES.names()


def simulation_only_policies() -> frozenset[str]:
    """Names of the policies only ``sluicegate simulate`` can run (they need true lengths)."""
    return frozenset(name for name in POLICIES if POLICIES.get(name).simulation_only)


def make_queue(lane: LaneSpec, weights: Mapping[str, float]) -> LaneQueue:
    """The queue for ``lane`` under its configured policy."""
    return POLICIES.get(lane.policy)().make_queue(lane, weights)
