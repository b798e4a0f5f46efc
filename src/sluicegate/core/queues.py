"""Lane queues, each able to tell the predicted work its policy runs before any entry.

``HeapQueue`` orders one flow by a time-invariant key (fairness ``none``): in a
binary heap with lazy deletion, or, in lanes that need the start estimate, in a
``SortedWork`` (sorted blocks with sums of predicted service, O(log n) per
operation plus a short block move). ``FairQueue`` (fairness ``vtc``,
``core/fair_queue.py``) is built from one ``HeapQueue`` per tenant. Both count
the remaining work of the lane's running entries (``core/work_ahead.py``).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from typing import Protocol

from sluicegate.core.entry import Entry
from sluicegate.core.work_ahead import Item, Mark, RunningWork, SortedWork

KeyFn = Callable[[Entry], tuple[float, ...]]


class LaneQueue(Protocol):
    """The queue of one lane.

    Contract: ``peek``/``pop`` return the entry the policy would serve next;
    ``remove`` takes any queued entry out in O(log n) amortised; ``len`` counts
    live entries only. ``on_admit`` and ``on_finish`` let fairness policies
    account for service, and ``counter`` reports that account (queues without
    fairness report ``None``); both also track the lane's running work.
    ``work_ahead`` and ``running_work`` give a waiting ticket's start estimate.

    A Protocol rather than a base class: the two queues share no code, and the
    scheduler needs only these methods.
    """

    def track_work(self) -> None:
        """From now on keep what ``work_ahead`` and ``running_work`` need (call it before the
        first push). Queues that are not told skip that bookkeeping."""
        ...

    def push(self, entry: Entry) -> None:
        """Add a queued entry."""
        ...

    def peek(self) -> Entry | None:
        """The next entry to serve, or ``None`` if empty."""
        ...

    def pop(self) -> Entry:
        """Remove and return the next entry; ``IndexError`` if empty."""
        ...

    def remove(self, entry: Entry) -> None:
        """Take ``entry`` out (cancel, expiry)."""
        ...

    def on_admit(self, entry: Entry) -> None:
        """``entry`` (just popped) took a slot."""
        ...

    def on_finish(self, entry: Entry, prompt_tokens: int, completion_tokens: int) -> None:
        """``entry`` left its slot having been served these tokens (0, 0 if it never ran)."""
        ...

    def counter(self, tenant: str) -> float | None:
        """The tenant's fair-share counter, or ``None`` when the queue keeps none."""
        ...

    def work_ahead(self, entry: Entry) -> float:
        """Predicted service of the queued entries the policy serves before ``entry``.

        ``entry`` may be queued or not (a ticket about to be); it never counts itself.
        """
        ...

    def running_work(self, now: float) -> float:
        """Remaining predicted work at ``now`` of the lane's running entries (``on_admit``
        until ``on_finish``); 0 unless tracking work."""
        ...

    def __len__(self) -> int: ...


_HeapItem = tuple[float | int | Entry, ...]


def _live_item(item: _HeapItem) -> bool:
    entry = item[-1]
    return isinstance(entry, Entry) and item[-2] == entry.queue_gen


class HeapQueue:
    """One flow ordered by ``key(entry)``, then submission order.

    Two stores, chosen once, before the first push. By default a binary heap
    with lazy deletion: items are ``key + (seq, queue_gen, entry)``, a removed
    entry's item goes stale (its ``queue_gen`` moved on) and is skipped when it
    reaches the top, and the heap is compacted when stale items dominate. A
    queue told to ``track_work`` keeps a ``SortedWork`` instead (sorted blocks
    with sums of predicted service; items ``key + (seq, entry)``, removed at
    once), so the work queued before any entry is known (``work_ahead``); it
    costs more per operation, so only lanes that need the estimate pay it.
    """

    __slots__ = ("_heap", "_items", "_key", "_live", "_running", "_track", "running_work")

    def __init__(self, key: KeyFn) -> None:
        self._key = key
        self._track = False
        # Flat items: one tuple comparison per heap step.
        self._heap: list[_HeapItem] = []
        self._live = 0
        self._items = SortedWork()
        self._running = RunningWork()
        self.running_work: Callable[[float], float] = self._running.remaining
        """Remaining predicted work at ``now`` of the entries admitted through ``on_admit``
        (``RunningWork.remaining``, bound here to save a call on every submit)."""

    def _item(self, entry: Entry) -> Item:
        item = entry.queue_item
        return (*self._key(entry), entry.seq, entry) if item is None else item

    def push(self, entry: Entry) -> None:
        """Add ``entry``; its ``queue_gen`` marks this push so stale items are skipped."""
        entry.queue_gen += 1
        if not self._track:
            queued: _HeapItem = (*self._key(entry), entry.seq, entry.queue_gen, entry)
            heapq.heappush(self._heap, queued)
            self._live += 1
            return
        item: Item = (*self._key(entry), entry.seq, entry)
        entry.queue_item = item
        self._items.add(item, entry.service_s)

    def track_work(self) -> None:
        """Keep a ``SortedWork`` from now on: measure the work before each push and count
        running work. Only before the first push.

        Raises:
            ValueError: the queue already holds entries.
        """
        if self._live or self._items.size:
            raise ValueError("track_work must be called before the first push")
        self._track = True

    def _prune(self) -> None:
        heap = self._heap
        while heap:
            item = heap[0]
            entry = item[-1]
            assert isinstance(entry, Entry)
            if item[-2] == entry.queue_gen:
                return
            heapq.heappop(heap)

    def peek(self) -> Entry | None:
        """The entry with the smallest key."""
        if not self._track:
            self._prune()
            if not self._heap:
                return None
            entry = self._heap[0][-1]
        else:
            first = self._items.first()
            if first is None:
                return None
            entry = first[-1]
        assert isinstance(entry, Entry)
        return entry

    def pop(self) -> Entry:
        """Remove and return the entry with the smallest key."""
        if not self._track:
            self._prune()
            entry = heapq.heappop(self._heap)[-1]
            self._live -= 1
        else:
            # ``queue_item`` is left stale: only a queued or new entry's item is ever read,
            # and the next push replaces it.
            entry = self._items.pop_first()[-1]
        assert isinstance(entry, Entry)
        entry.queue_gen += 1
        return entry

    def remove(self, entry: Entry) -> None:
        """Take ``entry`` out; when tracking, ``KeyError`` if it is not queued here."""
        if not self._track:
            entry.queue_gen += 1
            self._live -= 1
            if len(self._heap) > 2 * self._live + 64:
                self._heap = [item for item in self._heap if _live_item(item)]
                heapq.heapify(self._heap)
            return
        self._items.discard(self._item(entry))
        entry.queue_gen += 1
        entry.queue_item = None

    def on_admit(self, entry: Entry) -> None:
        """Count ``entry``'s predicted work as running (no fair-share accounting)."""
        if self._track:
            self._running.add(entry)

    def on_finish(self, entry: Entry, prompt_tokens: int, completion_tokens: int) -> None:
        """``entry``'s work no longer runs (no fair-share accounting)."""
        if self._track:
            self._running.discard(entry)

    def counter(self, tenant: str) -> float | None:
        """``None``: a single flow keeps no fair-share counters."""
        return None

    def work_ahead(self, entry: Entry) -> float:
        """Predicted service of the queued entries with a smaller (key, seq) than ``entry``.

        Raises:
            ValueError: the queue does not track work (``track_work`` was not called).
        """
        if not self._track:
            raise ValueError("this queue does not track work: call track_work first")
        return self._items.work_before(self._item(entry))

    @property
    def total_work(self) -> float:
        """Predicted service of every queued entry (0 unless tracking work)."""
        return self._items.total

    def work_marks(self, count: int) -> tuple[Mark, ...]:
        """Queued entries spread evenly by work (``SortedWork.spread``, at most ``count + 1``)
        as their keys, the work before each and that plus their own: the summary of this
        queue distributed mode publishes (empty unless tracking work)."""
        marks: list[Mark] = []
        for item, before, after in self._items.spread(count):
            entry = item[-1]
            assert isinstance(entry, Entry)
            marks.append((self._key(entry), before, after))
        return tuple(marks)

    def __len__(self) -> int:
        return self._items.size if self._track else self._live
