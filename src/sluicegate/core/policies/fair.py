"""Per-tenant fair share of served tokens, least slack within a tenant."""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

from sluicegate.core.policies.base import POLICIES
from sluicegate.core.policies.slack import SlackOrdering
from sluicegate.core.queues import FairQueue, LaneQueue
from sluicegate.core.spec import LaneSpec


@POLICIES.register("fair")
class FairPolicy:
    """Virtual token counter fairness between tenants, then ``slack`` order.

    See ``FairQueue`` for the counter rules; two backlogged tenants' weighted
    service differs by at most about twice the largest request's weighted cost.
    """

    name: ClassVar[str] = "fair"
    simulation_only: ClassVar[bool] = False

    def make_queue(self, lane: LaneSpec, weights: Mapping[str, float]) -> LaneQueue:
        """A two-tier queue: VTC between tenants, slack within each."""
        return FairQueue(SlackOrdering(lane).key, weights)
