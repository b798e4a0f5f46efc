"""First in, first out: the baseline."""

from __future__ import annotations

from sluicegate.core.entry import Entry
from sluicegate.core.policies.policy import Ordering


class FifoOrdering(Ordering):
    """Serve in arrival order."""

    name = "fifo"

    def key(self, entry: Entry) -> tuple[float, ...]:
        """Arrival time."""
        return (entry.ticket.arrival,)
