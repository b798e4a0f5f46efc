"""The simulator's event heap and the order of events at one instant.

Events live on one heap keyed ``(time, kind, time posted, chain point, sequence)``
(SimPy style), so ties are broken deterministically: at one instant, engine step
completions come first, then responses reaching the gateway (freeing slots; only
with ``EngineConfig.response_overhead_s``), arrivals, scheduler ticks, metric
scrapes, requests reaching their engines (only with
``EngineConfig.request_overhead_s``), and last the first step of replicas that
were idle, so requests arriving together share it.

Ties among step completions: driven step by step, events at one instant run in
the order they were posted, and a step's completion is posted by the event that
started the step, so equal times are ordered by when the events were posted, then
by the events that posted them, recursively. A step's heap item carries the time
it was posted and a ``ChainPoint`` that replays that recursion over the replica's
step boundaries, so decode runs (``sim/replica.py``) break ties as step-by-step
driving does.
"""

from __future__ import annotations

from array import array
from heapq import heapify, heappush

STEP, RESPONSE, ARRIVAL, TICK, SCRAPE, DELIVER, WAKE = 0, 1, 2, 3, 4, 5, 6
"""Event kinds, in the order they run at one instant."""


class ChainPoint:
    """A step completion's place among same-instant step completions of other replicas.

    A continuous-batching replica's steps form a chain from the wake that
    started it: the completion of step k, ending at ``t[k+1]`` and posted at
    ``t[k]``, is posted while the completion of step k − 1 is handled. Its
    step-by-step heap position is therefore the key ``(t[k+1], STEP, t[k],
    STEP, t[k−1], …, STEP, t[0], WAKE, wake posted, wake sequence)``; two
    completions at the same time, posted at the same time, compare by the rest.

    Args:
        history: the chain's step start times; entries up to ``index`` never change.
        index: position of the step's start (the time the completion is posted).
        origin: ``(time posted, sequence)`` of the wake that started the chain.
    """

    __slots__ = ("history", "index", "origin")

    def __init__(self, history: array[float], index: int, origin: tuple[float, int]) -> None:
        self.history = history
        self.index = index
        self.origin = origin

    def __lt__(self, other: ChainPoint) -> bool:
        """Whether this completion comes first; both end and were posted at the same times."""
        mine, theirs = self.history, other.history
        i, j = self.index - 1, other.index - 1
        while i >= 0 and j >= 0:
            a, b = mine[i], theirs[j]
            if a != b:
                return a < b
            i -= 1
            j -= 1
        if i >= 0 or j >= 0:
            return i >= 0  # the other reached its wake, which sorts after any step completion
        return self.origin < other.origin


HeapItem = tuple[float, int, float, ChainPoint | None, int, int]
"""``(time, kind, time posted, chain point of a step, sequence, replica index)``."""


class EventQueue:
    """The heap of pending events; the driver pops ``heap`` directly in its loop.

    Attributes:
        heap: pending ``HeapItem``s, a ``heapq`` heap.
        seq: the sequence number of the last event posted.
    """

    __slots__ = ("heap", "seq")

    def __init__(self) -> None:
        self.heap: list[HeapItem] = []
        self.seq = 0

    def push(
        self, at: float, kind: int, index: int, posted: float, point: ChainPoint | None
    ) -> HeapItem:
        """Post an event at ``at``, as if posted at ``posted`` (ties go to the earlier)."""
        self.seq += 1
        item = (at, kind, posted, point, self.seq, index)
        heappush(self.heap, item)
        return item

    def remove(self, item: HeapItem) -> None:
        """Take a posted event back."""
        self.heap.remove(item)
        heapify(self.heap)
