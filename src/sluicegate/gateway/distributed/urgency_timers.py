"""When a waiting ticket turns urgent, its replica syncs (DESIGN §16, preemption across
replicas): the store preempts for an urgent waiter at a fill, and without a sync at that
moment the next one might be a heartbeat away."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from sluicegate.core.ticket import TicketId

URGENCY_MARGIN_S = 0.002
"""How long after a waiter's urgent time its replica syncs, so that the store (whose clock
may lag by NTP's milliseconds) sees it urgent."""


class UrgencyTimers:
    """One timer per offered ticket that may turn urgent, calling ``nudge(model)`` then;
    disarmed when the ticket is granted or leaves."""

    def __init__(self, nudge: Callable[[str], None]) -> None:
        self._nudge = nudge
        self._timers: dict[TicketId, asyncio.TimerHandle] = {}

    def arm(self, model: str, ticket_id: TicketId, in_s: float) -> None:
        """Nudge ``model`` ``in_s`` seconds from now (plus the margin) unless disarmed."""
        self.disarm(ticket_id)
        loop = asyncio.get_running_loop()
        delay = max(0.0, in_s) + URGENCY_MARGIN_S
        self._timers[ticket_id] = loop.call_later(delay, self._fire, model, ticket_id)

    def disarm(self, ticket_id: TicketId) -> None:
        """The ticket was granted or left: no nudge for it."""
        timer = self._timers.pop(ticket_id, None)
        if timer is not None:
            timer.cancel()

    def clear(self) -> None:
        """Disarm every timer (the store was lost)."""
        for timer in self._timers.values():
            timer.cancel()
        self._timers.clear()

    def _fire(self, model: str, ticket_id: TicketId) -> None:
        del self._timers[ticket_id]
        self._nudge(model)
