"""Lane queues: binary heaps with lazy deletion, O(log n) per operation.

``HeapQueue`` orders one flow by a time-invariant key (fairness ``none``).
``FairQueue`` (fairness ``vtc``) is two tiers: a fairness tier that picks the
tenant with the smallest weighted virtual token counter (VTC), and a
``HeapQueue`` per tenant ordered by the lane's ordering key.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Mapping
from typing import Protocol

from sluicegate.core.entry import Entry

KeyFn = Callable[[Entry], tuple[float, ...]]

# Weights of served tokens in the virtual token counter, as in the VTC authors' artifact.
VTC_INPUT_WEIGHT = 1.0
VTC_OUTPUT_WEIGHT = 2.0


class LaneQueue(Protocol):
    """The queue of one lane.

    Contract: ``peek``/``pop`` return the entry the policy would serve next;
    ``remove`` takes any queued entry out in O(log n) amortised; ``len`` counts
    live entries only. ``on_admit`` and ``on_finish`` let fairness policies
    account for service, and ``counter`` reports that account; queues without
    fairness ignore the first two and report ``None``.

    A Protocol rather than a base class: the two queues share no code, and the
    scheduler needs only these methods.
    """

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

    def __len__(self) -> int: ...


_Item = tuple[float | int | Entry, ...]


def _live_item(item: _Item) -> bool:
    entry = item[-1]
    return isinstance(entry, Entry) and item[-2] == entry.queue_gen


class HeapQueue:
    """One flow ordered by ``key(entry)``, then submission order."""

    __slots__ = ("_heap", "_key", "_live")

    def __init__(self, key: KeyFn) -> None:
        self._key = key
        # Items are ``key + (seq, gen, entry)``, flat: one tuple comparison per heap step.
        self._heap: list[_Item] = []
        self._live = 0

    def push(self, entry: Entry) -> None:
        """Add ``entry``; its ``queue_gen`` marks this push so stale items are skipped."""
        entry.queue_gen += 1
        item: _Item = (*self._key(entry), entry.seq, entry.queue_gen, entry)
        heapq.heappush(self._heap, item)
        self._live += 1

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
        self._prune()
        if not self._heap:
            return None
        entry = self._heap[0][-1]
        assert isinstance(entry, Entry)
        return entry

    def pop(self) -> Entry:
        """Remove and return the entry with the smallest key."""
        self._prune()
        entry = heapq.heappop(self._heap)[-1]
        assert isinstance(entry, Entry)
        entry.queue_gen += 1
        self._live -= 1
        return entry

    def remove(self, entry: Entry) -> None:
        """Invalidate ``entry``'s heap item; compact when stale items dominate."""
        entry.queue_gen += 1
        self._live -= 1
        if len(self._heap) > 2 * self._live + 64:
            self._heap = [item for item in self._heap if _live_item(item)]
            heapq.heapify(self._heap)

    def on_admit(self, entry: Entry) -> None:
        """No accounting for a single flow."""

    def on_finish(self, entry: Entry, prompt_tokens: int, completion_tokens: int) -> None:
        """No accounting for a single flow."""

    def counter(self, tenant: str) -> float | None:
        """``None``: a single flow keeps no fair-share counters."""
        return None

    def __len__(self) -> int:
        return self._live


class FairQueue:
    """Virtual token counter fairness between tenants (Sheng et al., OSDI'24).

    Each tenant's counter grows by ``(1·prompt + 2·output tokens) / weight`` as
    it is served (predicted output at admission, corrected at finish). The
    backlogged tenant with the smallest counter is served next. When a tenant
    becomes backlogged its counter is lifted to the smallest backlogged counter
    (or, if none is backlogged, to the counter of the tenant served last), so
    idle time earns no credit.
    """

    __slots__ = (
        "_counters",
        "_frontier",
        "_heap",
        "_key",
        "_live",
        "_subs",
        "_versions",
        "_weights",
    )

    def __init__(self, key: KeyFn, weights: Mapping[str, float]) -> None:
        self._key = key
        self._weights = weights
        self._subs: dict[str, HeapQueue] = {}
        self._counters: dict[str, float] = {}
        self._versions: dict[str, int] = {}
        self._heap: list[tuple[float, int, str]] = []
        self._frontier = 0.0
        self._live = 0

    def counter(self, tenant: str) -> float:
        """The tenant's weighted virtual token counter (0 for a tenant never seen)."""
        return self._counters.get(tenant, 0.0)

    def _min_backlogged(self) -> str | None:
        heap = self._heap
        while heap:
            _, version, tenant = heap[0]
            if version == self._versions[tenant] and len(self._subs[tenant]) > 0:
                return tenant
            heapq.heappop(heap)
        return None

    def _advertise(self, tenant: str) -> None:
        version = self._versions.get(tenant, 0) + 1
        self._versions[tenant] = version
        heapq.heappush(self._heap, (self._counters.get(tenant, 0.0), version, tenant))
        if len(self._heap) > 4 * len(self._subs) + 64:
            self._heap = [
                item
                for item in self._heap
                if item[1] == self._versions[item[2]] and len(self._subs[item[2]]) > 0
            ]
            heapq.heapify(self._heap)

    def push(self, entry: Entry) -> None:
        """Queue ``entry`` under its tenant, lifting the tenant's counter if it was idle."""
        tenant = entry.ticket.tenant
        sub = self._subs.get(tenant)
        if sub is None:
            sub = self._subs[tenant] = HeapQueue(self._key)
        if len(sub) == 0:
            leader = self._min_backlogged()
            floor = self._counters[leader] if leader is not None else self._frontier
            self._counters[tenant] = max(self._counters.get(tenant, 0.0), floor)
            sub.push(entry)
            self._advertise(tenant)
        else:
            sub.push(entry)
        self._live += 1

    def peek(self) -> Entry | None:
        """The head of the least-served backlogged tenant."""
        tenant = self._min_backlogged()
        return None if tenant is None else self._subs[tenant].peek()

    def pop(self) -> Entry:
        """Remove and return the head of the least-served backlogged tenant."""
        tenant = self._min_backlogged()
        if tenant is None:
            raise IndexError("pop from an empty FairQueue")
        self._live -= 1
        return self._subs[tenant].pop()

    def remove(self, entry: Entry) -> None:
        """Take ``entry`` out of its tenant's queue."""
        self._subs[entry.ticket.tenant].remove(entry)
        self._live -= 1

    def _charge(self, tenant: str, tokens: float) -> None:
        self._counters[tenant] = self._counters.get(tenant, 0.0) + tokens / self._weights.get(
            tenant, 1.0
        )
        sub = self._subs.get(tenant)
        if sub is not None and len(sub) > 0:
            self._advertise(tenant)

    def on_admit(self, entry: Entry) -> None:
        """Charge the prompt and the predicted output to the tenant's counter."""
        tenant = entry.ticket.tenant
        self._frontier = self._counters.get(tenant, 0.0)
        self._charge(
            tenant,
            VTC_INPUT_WEIGHT * entry.ticket.prompt_tokens
            + VTC_OUTPUT_WEIGHT * entry.predicted_output_tokens,
        )

    def on_finish(self, entry: Entry, prompt_tokens: int, completion_tokens: int) -> None:
        """Correct the admission charge to the tokens really served."""
        delta = VTC_INPUT_WEIGHT * (prompt_tokens - entry.ticket.prompt_tokens) + (
            VTC_OUTPUT_WEIGHT * (completion_tokens - entry.predicted_output_tokens)
        )
        if delta:
            self._charge(entry.ticket.tenant, delta)

    def __len__(self) -> int:
        return self._live
