"""The engine's waiting queue: FCFS (a ``deque``) or ordered by priority (``PriorityWaiting``).

Both offer the few ``deque`` operations the schedule uses (``WaitingQueue``), so
the schedule's admission loop is the same code under either policy: it admits
from ``waiting[0]`` and stops at the first request that does not fit.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator
from typing import Protocol

from sluicegate.engine.step import SeqState

__all__ = ["PriorityWaiting", "WaitingQueue"]


class WaitingQueue(Protocol):
    """What the schedule needs of a waiting queue; ``collections.deque`` is the FCFS one."""

    def append(self, seq: SeqState, /) -> None:
        """Queue a newly added request."""

    def appendleft(self, seq: SeqState, /) -> None:
        """Queue a preempted request again."""

    def popleft(self) -> SeqState:
        """Remove and return the next request to admit."""

    def remove(self, seq: SeqState, /) -> None:
        """Remove an aborted request."""

    def __getitem__(self, index: int, /) -> SeqState:
        """``[0]`` is the next request to admit."""

    def __len__(self) -> int:
        """Requests waiting."""

    def __iter__(self) -> Iterator[SeqState]:
        """The waiting requests (in no promised order)."""


def priority_rank(seq: SeqState) -> tuple[int, float]:
    """vLLM's order of requests under ``--scheduling-policy priority``: lower ``priority``
    first, then earlier arrival (``vllm/v1/request.py``, ``Request.__lt__``)."""
    return seq.priority, seq.arrival


class PriorityWaiting:
    """Waiting requests ordered by ``(priority, arrival)``, as vLLM V1's
    ``PriorityRequestQueue`` (``vllm/v1/core/sched/request_queue.py``): a heap.

    Ties on both go to the request added first (vLLM breaks them by request id).
    A preempted request goes back by the same order, not to the front
    (``prepend_request`` is ``add_request`` there); it keeps its arrival time.
    """

    __slots__ = ("_heap",)

    def __init__(self) -> None:
        self._heap: list[tuple[int, float, int, SeqState]] = []

    def append(self, seq: SeqState, /) -> None:
        """Queue ``seq`` in its place."""
        heapq.heappush(self._heap, (seq.priority, seq.arrival, seq.order, seq))

    def appendleft(self, seq: SeqState, /) -> None:
        """Queue a preempted ``seq`` again: in its place, as ``append``."""
        self.append(seq)

    def popleft(self) -> SeqState:
        """Remove and return the first request in ``(priority, arrival)`` order."""
        return heapq.heappop(self._heap)[3]

    def remove(self, seq: SeqState, /) -> None:
        """Remove ``seq`` (``ValueError`` if it is not waiting)."""
        heap = self._heap
        for i, entry in enumerate(heap):
            if entry[3] is seq:
                heap[i] = heap[-1]
                heap.pop()
                heapq.heapify(heap)
                return
        raise ValueError(f"request {seq.req_id!r} is not waiting")

    def __getitem__(self, index: int, /) -> SeqState:
        """Only ``[0]``, the first request in order, is offered."""
        if index != 0:
            raise IndexError("a priority queue offers only its first request, [0]")
        return self._heap[0][3]

    def __len__(self) -> int:
        """Requests waiting."""
        return len(self._heap)

    def __iter__(self) -> Iterator[SeqState]:
        """The waiting requests, in heap order (not sorted)."""
        return (entry[3] for entry in self._heap)
