"""Work ahead of a waiting ticket: what its lane's policy runs before it (DESIGN §5, §6).

A ticket's estimated start is the predicted service of the queued tickets its
lane's policy serves before it, plus the remaining predicted work of the lane's
running tickets, spread over the lane's slots (``start_estimate_s``). Two
structures keep those sums cheap enough for every submit:

* ``SortedWork``: the queued items of one flow in order, in blocks of at most
  ``MAX_BLOCK`` items with per-block sums of predicted service, so the work
  before any position is two bisections plus two short sums (O(log n + √n)
  additions done in C; the shorter side of each sum is taken);
* ``RunningWork``: the remaining predicted work ``max(0, service_s − (now −
  admitted_at))`` summed over a lane's running tickets, from a heap of predicted
  end times retired as ``now`` passes them.

In distributed mode the other replicas' lanes hold work too: each publishes a
``LaneWork`` per lane through the store (DESIGN §16), and ``RemoteWork`` sums the
others' and tells how much of their queued work a ticket's policy runs before it.
"""

from __future__ import annotations

import heapq
import math
from bisect import bisect_left
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import accumulate

from sluicegate.core.entry import Entry

Item = tuple[float | int | Entry, ...]
"""A queue item: the ordering key, then the submission ``seq``, then the entry."""

MAX_BLOCK = 128
"""A block holding more items is split in two."""
MARKS = 32
"""How many steps of work a published queue summary marks (``SortedWork.spread``)."""
TENANT_MARKS = 8
"""How many steps of work each tenant's queue marks in a published ``vtc`` lane."""

Mark = tuple[tuple[float, ...], float, float]
"""A queued item of a published summary: its order key, the work queued before it, and
that plus its own work."""
TenantWork = tuple[str, float, tuple[Mark, ...]]
"""A tenant's queued work in a published ``vtc`` lane, and marks of its queue."""


class SortedWork:
    """Items kept in sorted order, each with an amount of work, with sums of work by position.

    Items must be unique and totally ordered (queue items end in a unique ``seq``).
    ``add``, ``discard`` and ``pop_first`` cost O(log n) comparisons plus moving at
    most ``MAX_BLOCK`` pointers; ``work_before`` O(log n) comparisons plus at most
    ``n ÷ MAX_BLOCK`` + ``MAX_BLOCK`` additions. An emptied block is dropped; small
    blocks are not merged.
    """

    __slots__ = ("_maxes", "_sums", "_works", "blocks", "size", "total")

    def __init__(self) -> None:
        self.blocks: list[list[Item]] = []
        """The items in order, block by block (read-only to callers: ``blocks[0][0]`` is
        the smallest)."""
        self.size = 0
        """How many items are held (read-only to callers)."""
        self.total = 0.0
        """The work of every item (read-only to callers; 0 exactly when empty)."""
        self._works: list[list[float]] = []
        self._sums: list[float] = []
        self._maxes: list[Item] = []

    def __len__(self) -> int:
        return self.size

    def first(self) -> Item | None:
        """The smallest item, or ``None`` when empty."""
        blocks = self.blocks
        return blocks[0][0] if blocks else None

    def add(self, item: Item, work: float) -> None:
        """Insert ``item`` with ``work``."""
        maxes = self._maxes
        self.size += 1
        self.total += work
        if not maxes:
            self.blocks.append([item])
            self._works.append([work])
            self._sums.append(work)
            maxes.append(item)
            return
        i = min(bisect_left(maxes, item), len(maxes) - 1)
        block = self.blocks[i]
        j = bisect_left(block, item)
        block.insert(j, item)
        self._works[i].insert(j, work)
        self._sums[i] += work
        if j == len(block) - 1:
            maxes[i] = item
        if len(block) > MAX_BLOCK:
            self._split(i)

    def _before(self, i: int, j: int, count: int) -> float:
        """The work before position ``j`` of block ``i`` (of ``count``), from the nearer end."""
        sums = self._sums
        before = sum(sums[:i], 0.0) if 2 * i <= count else self.total - sum(sums[i:], 0.0)
        works = self._works[i]
        if 2 * j <= len(works):
            before += sum(works[:j], 0.0)
        else:
            before += sums[i] - sum(works[j:], 0.0)
        return max(0.0, before)

    def _split(self, i: int) -> None:
        block = self.blocks[i]
        works = self._works[i]
        half = len(block) // 2
        self.blocks.insert(i + 1, block[half:])
        self._works.insert(i + 1, works[half:])
        del block[half:]
        del works[half:]
        self._sums[i] = sum(works, 0.0)
        self._sums.insert(i + 1, sum(self._works[i + 1], 0.0))
        self._maxes[i] = block[-1]
        self._maxes.insert(i + 1, self.blocks[i + 1][-1])
        # Incremental sums drift by rounding; a split is a cheap moment to start afresh.
        self.total = sum(self._sums, 0.0)

    def _delete(self, i: int, j: int) -> float:
        block = self.blocks[i]
        del block[j]
        work = self._works[i].pop(j)
        self.size -= 1
        if not block:
            del self.blocks[i]
            del self._works[i]
            del self._sums[i]
            del self._maxes[i]
            if not self.size:
                self.total = 0.0
                return work
        else:
            self._sums[i] -= work
            if j == len(block):
                self._maxes[i] = block[-1]
        self.total -= work
        return work

    def pop_first(self) -> Item:
        """Remove and return the smallest item; ``IndexError`` when empty."""
        if not self.blocks:
            raise IndexError("pop from an empty queue")
        item = self.blocks[0][0]
        self._delete(0, 0)
        return item

    def discard(self, item: Item) -> None:
        """Remove ``item``; ``KeyError`` when it is not held."""
        i = bisect_left(self._maxes, item)
        if i < len(self._maxes):
            block = self.blocks[i]
            j = bisect_left(block, item)
            if j < len(block) and block[j] == item:
                self._delete(i, j)
                return
        raise KeyError("item is not queued")

    def spread(self, count: int) -> list[tuple[Item, float, float]]:
        """Items spread evenly by work, each with the work before it and that plus its own:
        the first, the first item starting at or past each multiple ``j × total / count``
        (0 < j < ``count``) above the last one taken, and the last: at most ``count + 1``
        items (all of them when there are fewer). O(blocks + ``count`` bisections), plus
        one C-speed running sum per block visited."""
        out: list[tuple[Item, float, float]] = []
        step = self.total / count
        target = before = 0.0
        blocks, works = self.blocks, self._works
        last = len(blocks) - 1
        for i, block_sum in enumerate(self._sums):
            if i < last and before + block_sum < target:
                before += block_sum  # no item of this block starts at the next target
                continue
            block, block_works = blocks[i], works[i]
            size = len(block)
            starts = list(accumulate(block_works, initial=before))
            j = bisect_left(starts, target, 0, size)
            while j < size:
                start = starts[j]
                out.append((block[j], start, start + block_works[j]))
                # The next multiple of the step above ``start``, if below the total.
                nth = math.floor(start / step) + 1 if step > 0.0 else count
                target = nth * step if nth < count else math.inf
                j = bisect_left(starts, target, j + 1, size)
            if i == last and out[-1][0] is not block[-1]:
                start = starts[size - 1]
                out.append((block[-1], start, start + block_works[-1]))
            before = starts[size]
        return out

    def work_before(self, item: Item) -> float:
        """The work of the items smaller than ``item`` (held or not)."""
        maxes = self._maxes
        count = len(maxes)
        i = bisect_left(maxes, item)
        if i == count:
            return self.total
        return self._before(i, bisect_left(self.blocks[i], item), count)


class RunningWork:
    """Remaining predicted work of one lane's running tickets.

    A ticket counts ``max(0, admitted_at + service_s − now)``. The queue hears of
    an admission before the entry's ``admitted_at`` is set, so new entries wait in
    ``fresh`` until the next call reads them; a counted entry holds its predicted
    end in ``entry.run_end`` (NaN when not counted), and a heap of ends retires
    entries as ``now`` passes them. Calls must come with non-decreasing ``now``.
    """

    __slots__ = ("_count", "_ends", "_sum", "fresh")

    def __init__(self) -> None:
        self.fresh: list[Entry] = []
        """Admitted entries not yet read (``add`` appends them)."""
        self._ends: list[tuple[float, int, Entry]] = []
        self._sum = 0.0
        self._count = 0

    def add(self, entry: Entry) -> None:
        """``entry`` took a slot (its ``admitted_at`` may not be set yet)."""
        self.fresh.append(entry)

    def _settle(self) -> None:
        total = self._sum
        ends = self._ends
        for entry in self.fresh:
            end = entry.admitted_at + entry.service_s
            entry.run_end = end
            total += end
            heapq.heappush(ends, (end, entry.seq, entry))
        self._count += len(self.fresh)
        self._sum = total
        self.fresh.clear()

    def discard(self, entry: Entry) -> None:
        """``entry`` left its slot."""
        if self.fresh:
            self._settle()
        end = entry.run_end
        if end == end:  # not NaN: still counted
            entry.run_end = math.nan
            self._count -= 1
            self._sum = self._sum - end if self._count else 0.0

    def remaining(self, now: float) -> float:
        """Σ ``max(0, end − now)`` over the running tickets."""
        if self.fresh:
            self._settle()
        ends = self._ends
        while ends and ends[0][0] <= now:
            end, _, entry = heapq.heappop(ends)
            if entry.run_end == end:
                entry.run_end = math.nan
                self._count -= 1
                self._sum = self._sum - end if self._count else 0.0
        rest = self._sum - self._count * now
        return rest if rest > 0.0 else 0.0


def start_estimate_s(running_s: float, ahead_s: float, slots: int) -> float:
    """The estimated wait of a ticket: the running and queued work ahead of it over ``slots``."""
    return max(0.0, (running_s + ahead_s) / max(1, slots))


@dataclass(frozen=True, slots=True)
class LaneWork:
    """One replica's work in one lane, as it publishes it to the others (distributed mode).

    Attributes:
        running: units its lane runs (own and borrowed).
        running_s: remaining predicted work of its running tickets (``RunningWork``).
        waiting: tickets in its lane's queue.
        waiting_s: predicted service of those tickets.
        marks: a lane without fairness: items of its queue in the policy's order, evenly
            spread by work (``SortedWork.spread``), with the work before each.
        tenants: a ``vtc`` lane: each backlogged tenant's queued work, with marks of its
            queue in the lane's order.
    """

    running: int
    running_s: float
    waiting: int
    waiting_s: float
    marks: tuple[Mark, ...] = ()
    tenants: tuple[TenantWork, ...] = ()


def marked_before(
    marks: Sequence[Mark], keys: Sequence[tuple[float, ...]], key: tuple[float, ...]
) -> float:
    """The work of the items with an order key smaller than ``key`` in a queue summarised by
    ``marks`` (``keys``: their keys): exact outside the marks and between two adjacent
    items; between two marks further apart, the middle of what they allow."""
    i = bisect_left(keys, key)
    if i == 0:
        return 0.0
    if i == len(keys):
        return marks[-1][2]
    return 0.5 * (marks[i - 1][2] + marks[i][1])


class RemoteWork:
    """The other live replicas' work in one lane, summed (their ``LaneWork``s).

    ``running``, ``running_s``, ``waiting`` and ``waiting_s`` are the sums; ``tenants``
    sums a ``vtc`` lane's queued work per tenant; ``ahead`` places an order key among
    the others' waiters (of one tenant, in a ``vtc`` lane).
    """

    __slots__ = (
        "_marks",
        "_tenant_marks",
        "running",
        "running_s",
        "tenants",
        "waiting",
        "waiting_s",
    )

    def __init__(self, works: Sequence[LaneWork]) -> None:
        self.running = sum(work.running for work in works)
        self.running_s = math.fsum(work.running_s for work in works)
        self.waiting = sum(work.waiting for work in works)
        self.waiting_s = math.fsum(work.waiting_s for work in works)
        tenants: dict[str, float] = {}
        by_tenant: dict[str, list[tuple[Sequence[Mark], list[tuple[float, ...]]]]] = {}
        for work in works:
            for tenant, seconds, marks in work.tenants:
                tenants[tenant] = tenants.get(tenant, 0.0) + seconds
                if marks:
                    by_tenant.setdefault(tenant, []).append((marks, [m[0] for m in marks]))
        self.tenants = tenants
        self._tenant_marks = by_tenant
        self._marks = [(work.marks, [m[0] for m in work.marks]) for work in works if work.marks]

    def ahead(self, key: tuple[float, ...], tenant: str | None = None) -> float:
        """Predicted work of the others' waiters whose order key is smaller than ``key``
        (``marked_before`` per replica, summed): all of them in a lane without fairness
        (``tenant`` ``None``), ``tenant``'s in a ``vtc`` lane."""
        summaries = self._marks if tenant is None else self._tenant_marks.get(tenant, ())
        return sum((marked_before(marks, keys, key) for marks, keys in summaries), 0.0)
