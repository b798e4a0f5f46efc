"""Strict priority, FIFO within a priority."""

from __future__ import annotations

from sluicegate.core.entry import Entry
from sluicegate.core.policies.policy import Ordering


class PriorityOrdering(Ordering):
    """Serve the most important priority (lowest number) first, then by arrival."""

    name = "priority"

    def key(self, entry: Entry) -> tuple[float, ...]:
        """(priority, arrival)."""
        return (entry.ticket.priority, entry.ticket.arrival)
