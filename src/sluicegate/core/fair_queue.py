"""``FairQueue``: virtual token counter fairness between a lane's tenants (fairness ``vtc``).

Two tiers: a fairness tier that picks the tenant with the smallest weighted
virtual token counter (VTC), and a ``HeapQueue`` per tenant ordered by the
lane's ordering key (``core/queues.py``).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Mapping

from sluicegate.core.entry import Entry
from sluicegate.core.queues import HeapQueue, KeyFn
from sluicegate.core.work_ahead import RunningWork, TenantWork

# Weights of served tokens in the virtual token counter, as in the VTC authors' artifact.
VTC_INPUT_WEIGHT = 1.0
VTC_OUTPUT_WEIGHT = 2.0


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
        "_backlog_weight",
        "_counters",
        "_frontier",
        "_heap",
        "_key",
        "_live",
        "_queued_work",
        "_running",
        "_subs",
        "_track",
        "_versions",
        "_weights",
        "backlogged",
        "running_work",
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
        self.backlogged = 0
        """Tenants with queued entries."""
        self._queued_work = 0.0
        self._backlog_weight = 0.0
        self._track = False
        self._running = RunningWork()
        self.running_work: Callable[[float], float] = self._running.remaining
        """Remaining predicted work at ``now`` of the lane's running entries."""

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
            if self._track:
                sub.track_work()
        if len(sub) == 0:
            leader = self._min_backlogged()
            floor = self._counters[leader] if leader is not None else self._frontier
            self._counters[tenant] = max(self._counters.get(tenant, 0.0), floor)
            sub.push(entry)
            self._advertise(tenant)
            self._backlog_weight += self._weights.get(tenant, 1.0)
            self.backlogged += 1
        else:
            sub.push(entry)
        self._live += 1
        self._queued_work += entry.service_s

    def _others(self, sub: HeapQueue | None, weight: float) -> tuple[float, float]:
        """The queued work and summed weight of the backlogged tenants other than ``sub``'s."""
        others = self._queued_work
        others_weight = self._backlog_weight
        if sub is not None and len(sub):
            others -= sub.total_work
            others_weight -= weight
        return others, others_weight

    def _left(self, entry: Entry, sub: HeapQueue) -> None:
        """``entry`` left ``sub`` (popped or removed): the lane's totals follow."""
        self._live -= 1
        if not len(sub):
            self.backlogged -= 1
        if not self._live:
            self._queued_work = self._backlog_weight = 0.0
            return
        self._queued_work -= entry.service_s
        if not len(sub):
            self._backlog_weight -= self._weights.get(entry.ticket.tenant, 1.0)

    def peek(self) -> Entry | None:
        """The head of the least-served backlogged tenant."""
        tenant = self._min_backlogged()
        return None if tenant is None else self._subs[tenant].peek()

    def peek_among(self, accept: Callable[[str], bool]) -> Entry | None:
        """The head of the least-served backlogged tenant that ``accept`` takes, or ``None``.

        O(tenants): for the rare admission that passes over the least-served tenant.
        """
        best: str | None = None
        best_counter = 0.0
        for tenant, sub in self._subs.items():
            if len(sub) and accept(tenant):
                counter = self._counters.get(tenant, 0.0)
                if best is None or counter < best_counter:
                    best, best_counter = tenant, counter
        return None if best is None else self._subs[best].peek()

    def pop(self) -> Entry:
        """Remove and return the head of the least-served backlogged tenant."""
        tenant = self._min_backlogged()
        if tenant is None:
            raise IndexError("pop from an empty FairQueue")
        sub = self._subs[tenant]
        entry = sub.pop()
        self._left(entry, sub)
        return entry

    def remove(self, entry: Entry) -> None:
        """Take ``entry`` out of its tenant's queue."""
        sub = self._subs[entry.ticket.tenant]
        sub.remove(entry)
        self._left(entry, sub)

    def track_work(self) -> None:
        """Measure the work before each push (in every tenant's queue) and count running work."""
        self._track = True
        for sub in self._subs.values():
            sub.track_work()

    def work_ahead(self, entry: Entry) -> float:
        """Weighted GPS between backlogged tenants, the ordering within ``entry``'s tenant.

        ``entry``'s tenant t must serve its own work ahead A plus ``entry`` (S), which
        takes ``(A + S) ÷ w_t`` of virtual time; meanwhile the other backlogged tenants
        are served ``min(W, (A + S) · w ÷ w_t)`` of their queued work W, w their summed
        weight (exact with two tenants, an upper bound with more). It
        ignores the counters' present offsets (a tenant behind in served tokens goes
        first until it catches up), that counters charge tokens rather than seconds,
        and work arriving later.
        """
        tenant = entry.ticket.tenant
        sub = self._subs.get(tenant)
        weight = self._weights.get(tenant, 1.0)
        own = 0.0 if sub is None else sub.work_ahead(entry)
        others, others_weight = self._others(sub, weight)
        return gps_ahead(own, entry.service_s, weight, others, others_weight)

    def work_ahead_with(
        self, entry: Entry, own_remote: float, remote: Mapping[str, float]
    ) -> float:
        """``work_ahead`` with other replicas' queued work (distributed mode) joined to this
        queue's: ``own_remote`` of the ticket's tenant's work there is ahead of it, and of
        ``remote`` (each tenant's work there) the other tenants' joins their GPS share, a
        tenant backlogged only there joining their weight."""
        tenant = entry.ticket.tenant
        sub = self._subs.get(tenant)
        weight = self._weights.get(tenant, 1.0)
        own = (0.0 if sub is None else sub.work_ahead(entry)) + own_remote
        others, others_weight = self._others(sub, weight)
        for name, work in remote.items():
            if name != tenant and work > 0.0:
                others += work
                held = self._subs.get(name)
                if held is None or not len(held):
                    others_weight += self._weights.get(name, 1.0)
        return gps_ahead(own, entry.service_s, weight, others, others_weight)

    @property
    def total_work(self) -> float:
        """Predicted service of every queued entry (0 unless tracking work)."""
        return self._queued_work if self._live else 0.0

    def tenant_work(self, count: int) -> tuple[TenantWork, ...]:
        """Each backlogged tenant's queued work, with marks of its queue (``HeapQueue.work_marks``,
        at most ``count + 1``; tracking work only: else 0 and none)."""
        return tuple(
            (tenant, sub.total_work, sub.work_marks(count))
            for tenant, sub in self._subs.items()
            if len(sub)
        )

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
        if self._track:
            self._running.add(entry)
        self._frontier = self._counters.get(tenant, 0.0)
        self._charge(
            tenant,
            VTC_INPUT_WEIGHT * entry.ticket.prompt_tokens
            + VTC_OUTPUT_WEIGHT * entry.predicted_output_tokens,
        )

    def on_finish(self, entry: Entry, prompt_tokens: int, completion_tokens: int) -> None:
        """Correct the admission charge to the tokens really served."""
        if self._track:
            self._running.discard(entry)
        delta = VTC_INPUT_WEIGHT * (prompt_tokens - entry.ticket.prompt_tokens) + (
            VTC_OUTPUT_WEIGHT * (completion_tokens - entry.predicted_output_tokens)
        )
        if delta:
            self._charge(entry.ticket.tenant, delta)

    def __len__(self) -> int:
        return self._live


def gps_ahead(
    own: float, service_s: float, weight: float, others: float, others_weight: float
) -> float:
    """``own`` plus the other tenants' GPS share while ``own + service_s`` is served.

    Weighted GPS on the aggregate of the others (queued work ``others``, summed weight
    ``others_weight``): min(W, x·w) for x = (A + S) ÷ w_t. Exact with one other tenant;
    with more, an upper bound of Σ min(W_u, x·w_u) (a tenant with little work left
    stops taking its share sooner).
    """
    share = (own + service_s) / weight * others_weight
    if others < share:
        share = others
    return own + share if share > 0.0 else own
