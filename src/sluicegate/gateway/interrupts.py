"""Interrupting one request's network waits: client gone, preempted, or a deadline passed.

A request runs as one task. While it waits on the network it is *armed*; an
interrupt then cancels the task, and the handler turns that cancellation into
an ``WaitInterruptedError`` carrying the reason. Outside those waits an interrupt is only
recorded, and the next ``arm`` raises it. This costs one flag per wait instead
of a task and an ``asyncio.wait`` per wait.

Deadlines are lazy: moving one forward is a float store, and its timer re-arms
itself when it finds the deadline moved, so a stream of chunks costs no timer
churn.
"""

from __future__ import annotations

import asyncio
import enum
import math
from collections.abc import Callable

from sluicegate.core.decisions import Preempt

_NEVER = math.inf


class Interrupt(enum.Enum):
    """Why a request's wait was interrupted."""

    DISCONNECTED = "disconnected"
    PREEMPTED = "preempted"
    CLIENT_STALLED = "client_stalled"
    UPSTREAM_TIMEOUT = "upstream_timeout"


class WaitInterruptedError(Exception):
    """A wait ended early for ``reason``."""

    def __init__(self, reason: Interrupt) -> None:
        super().__init__(reason.value)
        self.reason = reason


class Deadline:
    """A moment after which ``fire`` is called, cheap to move while it is pending."""

    __slots__ = ("_fire", "_handle", "_loop", "_when", "due")

    def __init__(self, loop: asyncio.AbstractEventLoop, fire: Callable[[], None]) -> None:
        self._loop = loop
        self._fire = fire
        self._handle: asyncio.TimerHandle | None = None
        self._when = _NEVER
        self.due = _NEVER

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
        self.due = _NEVER

    def cancel(self) -> None:
        """Stop the timer for good."""
        self.due = _NEVER
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
            self._when = _NEVER

    def _check(self) -> None:
        self._handle = None
        self._when = _NEVER
        if self.due == _NEVER:
            return
        if self._loop.time() >= self.due:
            self.due = _NEVER
            self._fire()
        else:
            self._when = self.due
            self._handle = self._loop.call_at(self.due, self._check)


class Interruptible:
    """The interrupt state of the current task's request."""

    __slots__ = ("_armed", "_task", "client", "gone", "reason", "upstream")

    def __init__(self) -> None:
        task = asyncio.current_task()
        if task is None:
            raise RuntimeError("Interruptible needs a running task")
        loop = task.get_loop()
        self._task = task
        self._armed = False
        self.reason: Interrupt | None = None
        self.gone = False
        self.upstream = Deadline(loop, lambda: self.fire(Interrupt.UPSTREAM_TIMEOUT))
        self.client = Deadline(loop, lambda: self.fire(Interrupt.CLIENT_STALLED))

    def fire(self, reason: Interrupt) -> None:
        """Record ``reason`` (the first one wins) and cancel the task if it is waiting."""
        if reason is Interrupt.DISCONNECTED:
            self.gone = True
        if self.reason is None:
            self.reason = reason
        if self._armed:
            self._armed = False
            self._task.cancel()

    def preempted(self, _decision: Preempt) -> None:
        """The driver's preemption callback."""
        self.fire(Interrupt.PREEMPTED)

    def arm(self) -> None:
        """Enter a wait; raise at once if an interrupt came while not waiting."""
        if self.reason is not None:
            raise WaitInterruptedError(self.reason)
        self._armed = True

    def disarm(self) -> None:
        """Leave a wait."""
        self._armed = False

    def interrupted(self) -> WaitInterruptedError:
        """Call in ``except CancelledError`` during an armed wait: the interrupt to raise.

        Re-raises the cancellation when it did not come from an interrupt (shutdown).
        """
        self._armed = False
        if self.reason is None:
            raise asyncio.CancelledError
        self._task.uncancel()
        return WaitInterruptedError(self.reason)

    def reset(self) -> None:
        """Forget a handled interrupt; a client that left stays gone."""
        self.reason = Interrupt.DISCONNECTED if self.gone else None

    def close(self) -> None:
        """Stop both deadlines."""
        self._armed = False
        self.upstream.cancel()
        self.client.cancel()
