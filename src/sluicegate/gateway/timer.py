"""A lazy deadline timer on the event loop's clock, cheap to move while it is pending.

Network deadlines (a request's first byte and idle gaps, a client that stops
reading, a connection's header and body timeouts) move on every read. Moving
a ``LazyTimer``'s deadline later is a float store: the loop timer, when it goes
off early, finds the deadline moved and re-arms itself at it. Only moving it
earlier re-arms at once. So a stream of chunks costs no timer churn.

These deadlines run on the loop's own clock (``loop.time()``), not on the
gateway's injectable scheduling clock: they bound real waits on sockets, and
``loop.call_at`` can only wake on the loop's clock.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable

NEVER = math.inf


class LazyTimer:
    """Calls ``fire`` once, when the loop's clock passes ``due``; ``due`` moves cheaply.

    ``after`` sets the deadline, ``clear`` disables it (the timer, if any, finds
    nothing due and stops), ``cancel`` stops the timer for good. ``fire`` runs
    at most once per deadline set.
    """

    __slots__ = ("_fire", "_handle", "_loop", "_when", "due")

    def __init__(self, loop: asyncio.AbstractEventLoop, fire: Callable[[], None]) -> None:
        self._loop = loop
        self._fire = fire
        self._handle: asyncio.TimerHandle | None = None
        self._when = NEVER
        self.due = NEVER

    def after(self, seconds: float) -> None:
        """Fire ``seconds`` from now unless moved or cleared before."""
        due = self._loop.time() + seconds
        self.due = due
        if due < self._when:
            if self._handle is not None:
                self._handle.cancel()
            self._when = due
            self._handle = self._loop.call_at(due, self._check)

    def clear(self) -> None:
        """Never fire (the timer, if any, finds nothing due and stops)."""
        self.due = NEVER

    def cancel(self) -> None:
        """Stop the timer for good."""
        self.due = NEVER
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
            self._when = NEVER

    def _check(self) -> None:
        self._handle = None
        self._when = NEVER
        if self.due == NEVER:
            return
        if self._loop.time() >= self.due:
            self.due = NEVER
            self._fire()
        else:
            self._when = self.due
            self._handle = self._loop.call_at(self.due, self._check)
