"""Least slack first: earliest deadline first, aware of job size."""

from __future__ import annotations

from sluicegate.core.entry import Entry
from sluicegate.core.policies.policy import Ordering


class SlackOrdering(Ordering):
    """Serve the smallest slack ``deadline − now − service_s``, then higher priority.

    ``now`` is common to every ticket, so the key is ``deadline − service_s``.
    """

    name = "slack"

    def key(self, entry: Entry) -> tuple[float, ...]:
        """(latest start time, priority)."""
        return (entry.deadline - entry.service_s, entry.ticket.priority)
