"""A plain-Python model of one model's global state in the store, to check the Lua against.

All replicas are live (liveness has its own tests). It follows the brief of the
sync script step by step with the same float arithmetic, so a correct script
agrees with it exactly: same grants, in the same order, to the same replicas.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sluicegate.store.order import encode_order
from sluicegate.store.types import Drop, ModelLimits, Offer


@dataclass
class _Waiter:
    offer: Offer
    member: str


@dataclass
class ReferenceStore:
    """The waiting sets, leases, counters and frontiers of one model."""

    limits: ModelLimits
    waiting: dict[tuple[str, str], _Waiter] = field(default_factory=dict)
    leases: dict[tuple[str, str], Offer] = field(default_factory=dict)
    counters: dict[str, dict[str, float]] = field(default_factory=dict)
    frontiers: dict[str, float] = field(default_factory=dict)
    pushed: dict[str, list[str]] = field(default_factory=dict)

    def _fair(self, lane: str) -> bool:
        return any(spec.name == lane and spec.fair for spec in self.limits.lanes)

    def _backlogged(self, lane: str) -> set[str]:
        return {w.offer.tenant for w in self.waiting.values() if w.offer.lane == lane}

    def _counter(self, lane: str, tenant: str) -> float:
        return self.counters.setdefault(lane, {}).get(tenant, 0.0)

    def _offer(self, replica: str, offer: Offer) -> None:
        key = (replica, offer.ticket)
        if key in self.waiting or key in self.leases:
            return
        if self._fair(offer.lane):
            backlogged = self._backlogged(offer.lane)
            if offer.tenant not in backlogged:
                counters = [self._counter(offer.lane, other) for other in backlogged]
                floor = min(counters) if counters else self.frontiers.get(offer.lane, 0.0)
                if floor > self._counter(offer.lane, offer.tenant):
                    self.counters[offer.lane][offer.tenant] = floor
        member = f"{encode_order(offer.order)}|{replica}|{offer.ticket}"
        self.waiting[key] = _Waiter(offer, member)

    def _drop(self, replica: str, drop: Drop) -> None:
        key = (replica, drop.ticket)
        lease = self.leases.pop(key, None)
        if lease is not None:
            if self._fair(lease.lane) and drop.vtc_correction != 0:
                self.counters[lease.lane][lease.tenant] = (
                    self._counter(lease.lane, lease.tenant) + drop.vtc_correction / lease.weight
                )
            return
        self.waiting.pop(key, None)

    def _best(self, lane: str) -> tuple[str, str] | None:
        candidates = [(w.member, key) for key, w in self.waiting.items() if w.offer.lane == lane]
        if self._fair(lane) and candidates:
            tenant = min(self._backlogged(lane), key=lambda t: (self._counter(lane, t), t))
            candidates = [c for c in candidates if self.waiting[c[1]].offer.tenant == tenant]
        return min(candidates)[1] if candidates else None

    def sync(self, replica: str, ops: list[Offer | Drop]) -> list[str]:
        """Apply ``ops`` of ``replica``, fill; the caller's grants (others' go to ``pushed``)."""
        for op in ops:
            if isinstance(op, Offer):
                self._offer(replica, op)
            else:
                self._drop(replica, op)
        granted: list[str] = []
        limits = self.limits
        for lane in limits.lanes:
            limit = limits.cap if lane.borrow else min(lane.cap, limits.cap)
            while len(self.leases) < limits.cap and self.lane_running(lane.name) < limit:
                key = self._best(lane.name)
                if key is None:
                    break
                offer = self.waiting[key].offer
                if (
                    limits.token_budget is not None
                    and self.leases
                    and self.tokens() + offer.cost_tokens > limits.token_budget
                ):
                    break
                del self.waiting[key]
                if lane.fair:
                    before = self._counter(lane.name, offer.tenant)
                    self.frontiers[lane.name] = before
                    self.counters[lane.name][offer.tenant] = (
                        before + offer.vtc_charge / offer.weight
                    )
                self.leases[key] = offer
                if key[0] == replica:
                    granted.append(key[1])
                else:
                    self.pushed.setdefault(key[0], []).append(key[1])
        return granted

    def tokens(self) -> int:
        """Summed cost of the leases."""
        return sum(lease.cost_tokens for lease in self.leases.values())

    def lane_running(self, lane: str) -> int:
        """Leases in ``lane``."""
        return sum(1 for lease in self.leases.values() if lease.lane == lane)
