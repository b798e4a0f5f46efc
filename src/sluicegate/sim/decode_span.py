"""A decode run a replica is in, and where a given event falls among its step boundaries.

A replica in a decode run (``sim/replica.py``) posts one event for the run's end;
step-by-step driving would have handled one completion per step. ``passed``
says how many of the run's steps step-by-step driving would have started by the
time an event is handled, which is what the replica applies before anything
touches it (``Replica.sync``) and what its deferred progress reports are cut at
(``Replica.flush_progress``).
"""

from __future__ import annotations

from array import array
from bisect import bisect_left, bisect_right

from sluicegate.engine.model import DecodeRun
from sluicegate.sim.events import STEP, ChainPoint, HeapItem

__all__ = ["DecodeSpan"]


class DecodeSpan:
    """A decode run a replica is in: its steps start at ``times[0 … n−1]``, the last ends
    at ``times[n]``.

    Attributes:
        run: the engine's plan; none of its steps is applied to the engine yet.
        times: step boundaries, chained as step-by-step driving would: ``t + duration``.
        item: the heap item of the run's end, at ``times[n]``.
        base: where ``times[0]`` is in the replica's chain history.
        contiguous: how step 0's busy time is counted (see ``Replica.start_step``).
        steps_before: the replica's step count when the run started (steps completed).
    """

    __slots__ = ("base", "contiguous", "item", "run", "steps_before", "times")

    def __init__(
        self,
        run: DecodeRun,
        times: list[float],
        item: HeapItem,
        base: int,
        contiguous: bool,
        steps_before: int,
    ) -> None:
        self.run = run
        self.times = times
        self.item = item
        self.base = base
        self.contiguous = contiguous
        self.steps_before = steps_before

    def passed(self, event: HeapItem, history: array[float], origin: tuple[float, int]) -> int:
        """How many of the run's steps have started when ``event`` is handled (1 … n).

        Step k (k ≥ 1) starts when step k − 1's completion, at ``times[k]``, is handled,
        which is before ``event`` if it is earlier or, at the same instant, sorts first:
        a completion sorts before any other kind, and before another step's completion
        posted later or, posted at the same time, by the chains that posted them
        (``history`` and ``origin`` are the replica's chain, see ``ChainPoint``). The run's
        last completion is its own event, never passed here.
        """
        at, kind, posted, point, _, _ = event
        times = self.times
        last = len(times) - 1
        if kind != STEP:
            return bisect_right(times, at, 1, last)
        steps = bisect_left(times, at, 1, last)
        while steps < last and times[steps] == at:
            prev = times[steps - 1]
            if prev > posted:
                break
            if prev == posted and point is not None:
                mine = ChainPoint(history, self.base + steps - 1, origin)
                if not mine < point:
                    break
            steps += 1
        return steps
