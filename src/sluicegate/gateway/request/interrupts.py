"""Interrupting one request's network waits: client gone, preempted, or a deadline passed.

A request runs as one task. While it waits on the network it is *armed*
(``with interrupts.waiting():``); an interrupt then cancels the task, and the
wait turns that cancellation into a ``WaitInterruptedError`` carrying the
reason. Outside those waits an interrupt is only recorded, and the next wait
raises it at once. This costs one flag per wait instead of a task and an
``asyncio.wait`` per wait.

The deadlines (``upstream``, ``client``) are ``LazyTimer``s: moving one forward
is a float store, so a stream of chunks costs no timer churn.
"""

from __future__ import annotations

import asyncio
import enum

from sluicegate.core.decisions import Preempt
from sluicegate.errors import SluicegateError
from sluicegate.gateway.asyncio_driver import RunningHandle
from sluicegate.gateway.timer import LazyTimer


class Interrupt(enum.Enum):
    """Why a request's wait was interrupted."""

    DISCONNECTED = "disconnected"
    PREEMPTED = "preempted"
    CLIENT_STALLED = "client_stalled"
    UPSTREAM_TIMEOUT = "upstream_timeout"


class WaitInterruptedError(SluicegateError):
    """A wait ended early for ``reason``."""

    def __init__(self, reason: Interrupt) -> None:
        super().__init__(reason.value)
        self.reason = reason


class _Wait:
    """The context of one interruptible wait (see ``Interruptible.waiting``)."""

    __slots__ = ("_interrupts",)

    def __init__(self, interrupts: Interruptible) -> None:
        self._interrupts = interrupts

    def __enter__(self) -> None:
        self._interrupts._arm()

    def __exit__(self, kind: type[BaseException] | None, *_: object) -> None:
        interrupts = self._interrupts
        interrupts._armed = False
        if kind is asyncio.CancelledError:
            raise interrupts._interrupted() from None


class Interruptible:
    """The interrupt state of the current task's request."""

    __slots__ = ("_armed", "_task", "_wait", "client", "gone", "reason", "upstream")

    def __init__(self) -> None:
        task = asyncio.current_task()
        if task is None:
            raise RuntimeError("Interruptible needs a running task")
        loop = task.get_loop()
        self._task = task
        self._armed = False
        self._wait = _Wait(self)
        self.reason: Interrupt | None = None
        self.gone = False
        self.upstream = LazyTimer(loop, lambda: self.fire(Interrupt.UPSTREAM_TIMEOUT))
        self.client = LazyTimer(loop, lambda: self.fire(Interrupt.CLIENT_STALLED))

    def waiting(self) -> _Wait:
        """``with interrupts.waiting(): await ...``: an interruptible wait.

        Entering raises ``WaitInterruptedError`` at once if an interrupt came while
        not waiting; an interrupt during the wait cancels the task, and leaving
        turns that into ``WaitInterruptedError(reason)``. A cancellation that did
        not come from an interrupt (shutdown) stays a cancellation. It is a plain
        (not async) context manager on purpose: nothing can run between the end of
        the wait and its disarming.
        """
        return self._wait

    def fire(self, reason: Interrupt) -> None:
        """Record ``reason`` (the first one wins) and cancel the task if it is waiting."""
        if reason is Interrupt.DISCONNECTED:
            self.gone = True
        if self.reason is None:
            self.reason = reason
        if self._armed:
            self._armed = False
            self._task.cancel()

    def disconnected(self) -> None:
        """The client's connection is gone."""
        self.fire(Interrupt.DISCONNECTED)

    def preempted(self, _decision: Preempt) -> None:
        """The driver's preemption callback."""
        self.fire(Interrupt.PREEMPTED)

    def follow(self, handle: RunningHandle) -> None:
        """Be interrupted when the running ticket of ``handle`` is preempted (or already was)."""
        handle.on_preempt = self.preempted
        if handle.preempt is not None:
            self.fire(Interrupt.PREEMPTED)

    def reset(self) -> None:
        """Forget a handled interrupt; a client that left stays gone."""
        self.reason = Interrupt.DISCONNECTED if self.gone else None

    def close(self) -> None:
        """Stop both deadlines."""
        self._armed = False
        self.upstream.cancel()
        self.client.cancel()

    def _arm(self) -> None:
        if self.reason is not None:
            raise WaitInterruptedError(self.reason)
        self._armed = True

    def _interrupted(self) -> WaitInterruptedError:
        """The interrupt that cancelled the armed wait; re-raises a foreign cancellation."""
        self._armed = False
        if self.reason is None:
            raise asyncio.CancelledError
        self._task.uncancel()
        return WaitInterruptedError(self.reason)
