"""Shortest predicted job first, with aging so long jobs are not starved."""

from __future__ import annotations

from sluicegate.core.entry import Entry
from sluicegate.core.policies.policy import Ordering


class ShortestJobOrdering(Ordering):
    """Serve the smallest ``service_s − aging·(now − arrival)``.

    Subtracting ``aging·now`` from every key keeps the order, so the key is the
    time-invariant ``service_s + aging·arrival``: a ticket that has waited W
    seconds competes as if it were ``aging·W`` seconds shorter, which bounds
    starvation.
    """

    name = "sjf"

    def key(self, entry: Entry) -> tuple[float, ...]:
        """Predicted service time plus aging times arrival."""
        return (entry.service_s + self.aging * entry.ticket.arrival,)
