"""The gateway's scheduling clock: what ``now`` is for tickets, queues, circuits and metrics.

Every scheduling decision, deadline, circuit cool-down and metrics timestamp in
the gateway reads one clock, handed to ``build_app(..., clock=...)`` and held by
the ``SchedulerDriver``. In production it is ``time.monotonic``, which is also
the event loop's clock. Network deadlines stay on the loop's clock
(``gateway/timer.py``): they bound real waits.

``OffsetClock`` lets a test move scheduling time forward without sleeping: a
circuit's cool-down, a queue timeout or a rate-limit refill passes at once,
while the sockets, engines and timers stay real.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable

Clock = Callable[[], float]
"""Seconds on a monotonic scale; only differences between readings mean anything."""


class OffsetClock:
    """``time.monotonic()`` plus an offset that only grows: real time that a test can advance.

    Time flows as usual between ``advance`` calls, so everything measured from
    real waits (service times, time to first token) stays true. ``advance`` may
    be called from any thread; each gateway built on the clock is told on its
    own loop (``watch``), so its scheduler timer is re-armed at the new time:
    loop timers run on the loop's clock, which does not jump.
    """

    def __init__(self) -> None:
        self._offset = 0.0
        self._lock = threading.Lock()
        self._watchers: list[tuple[asyncio.AbstractEventLoop, Callable[[], None]]] = []

    def __call__(self) -> float:
        """The current reading."""
        return time.monotonic() + self._offset

    def advance(self, seconds: float) -> None:
        """Jump ``seconds`` ahead and tell every watcher (on its loop, soon after)."""
        if seconds < 0:
            raise ValueError(f"a clock only moves forward, got {seconds}")
        with self._lock:
            self._offset += seconds
            watchers = list(self._watchers)
        for loop, callback in watchers:
            loop.call_soon_threadsafe(callback)

    def watch(self, loop: asyncio.AbstractEventLoop, callback: Callable[[], None]) -> None:
        """Call ``callback`` on ``loop`` after each ``advance`` until ``unwatch``."""
        with self._lock:
            self._watchers.append((loop, callback))

    def unwatch(self, callback: Callable[[], None]) -> None:
        """Stop telling ``callback`` (a gateway shutting down)."""
        with self._lock:
            self._watchers = [(lp, cb) for lp, cb in self._watchers if cb != callback]


def wall_anchored_clock() -> Clock:
    """A monotonic clock that reads wall-clock seconds since the epoch at its creation.

    Distributed mode compares queue orders (arrivals, deadlines) across
    replicas, so their times must share a scale: each replica anchors its
    monotonic clock to the wall clock once (NTP keeps hosts within
    milliseconds), and it then never jumps with later wall-clock steps.
    """
    offset = time.time() - time.monotonic()
    return lambda: time.monotonic() + offset
