"""A plain-Python model of one model's global state in the store, to check the Lua against.

All replicas are live (liveness has its own tests). It follows the brief of the
sync script step by step with the same float arithmetic, so a correct script
agrees with it exactly: same grants and stops, in the same order, to the same
replicas. Time is counted in syncs: the state machine lets at least a millisecond
pass between two, so a lease of an earlier sync is older than the present one
(``admitted < now`` in the script), and leases of one sync tie on their time.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sluicegate.store.lua import milliseconds
from sluicegate.store.order import encode_order
from sluicegate.store.types import Drop, LaneLimits, ModelLimits, Offer

PREEMPT_SCAN = 64
URGENT_PER_SYNC = 16
NOW_MS = 10**13
"""Any urgent time below this is in the past, any above in the future (wall clock ms)."""

Key = tuple[str, str]


@dataclass
class _Waiter:
    offer: Offer
    member: str


@dataclass
class _Lease:
    offer: Offer
    admitted: int  # the sync that granted it
    lent: bool


@dataclass
class ReferenceStore:
    """The waiting sets, leases, counters, frontiers and preemption marks of one model."""

    limits: ModelLimits
    waiting: dict[Key, _Waiter] = field(default_factory=dict)
    leases: dict[Key, _Lease] = field(default_factory=dict)
    counters: dict[str, dict[str, float]] = field(default_factory=dict)
    frontiers: dict[str, float] = field(default_factory=dict)
    pushed: dict[str, list[str]] = field(default_factory=dict)
    stopping: dict[Key, tuple[str, Key, bool]] = field(default_factory=dict)
    pending: dict[str, Key] = field(default_factory=dict)
    tenant_weights: dict[tuple[str, str], float] = field(default_factory=dict)
    clock: int = 0
    _granted: list[str] = field(default_factory=list)
    _stops: list[str] = field(default_factory=list)

    def _fair(self, lane: str) -> bool:
        return any(spec.name == lane and spec.fair for spec in self.limits.lanes)

    def _backlogged(self, lane: str) -> set[str]:
        return {w.offer.tenant for w in self.waiting.values() if w.offer.lane == lane}

    def _counter(self, lane: str, tenant: str) -> float:
        return self.counters.setdefault(lane, {}).get(tenant, 0.0)

    def _offer(self, replica: str, offer: Offer) -> None:
        key = (replica, offer.ticket)
        if key in self.leases:
            self._granted.append(offer.ticket)  # a lost grant, granted again
            return
        if key in self.waiting:
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

    def _tell(self, caller: str, owner: str, item: str, answer: list[str]) -> None:
        if owner == caller:
            answer.append(item)
        else:
            self.pushed.setdefault(owner, []).append(item)

    def _grant(self, caller: str, key: Key, lent: bool) -> Offer:
        offer = self.waiting.pop(key).offer
        if self._fair(offer.lane):
            before = self._counter(offer.lane, offer.tenant)
            self.frontiers[offer.lane] = before
            self.counters[offer.lane][offer.tenant] = before + offer.vtc_charge / offer.weight
        if self._tenant_running(offer.lane, offer.tenant) == 0:
            self.tenant_weights[(offer.lane, offer.tenant)] = offer.weight
        self.leases[key] = _Lease(offer, self.clock, lent)
        self._tell(caller, key[0], key[1], self._granted)
        return offer

    def _tenant_running(self, lane: str, tenant: str) -> int:
        return sum(
            1 for x in self.leases.values() if x.offer.lane == lane and x.offer.tenant == tenant
        )

    def _drop(self, replica: str, drop: Drop) -> None:
        key = (replica, drop.ticket)
        lease = self.leases.pop(key, None)
        if lease is None:
            self.waiting.pop(key, None)
            return
        offer = lease.offer
        if self._tenant_running(offer.lane, offer.tenant) == 0:
            del self.tenant_weights[(offer.lane, offer.tenant)]
        if self._fair(offer.lane) and drop.vtc_correction != 0:
            self.counters[offer.lane][offer.tenant] = (
                self._counter(offer.lane, offer.tenant) + drop.vtc_correction / offer.weight
            )
        mark = self.stopping.pop(key, None)
        if mark is not None:
            lane, waiter, lent = mark
            if self.pending.get(lane) == key:
                del self.pending[lane]
            if waiter in self.waiting:
                self._grant(replica, waiter, lent)

    def _best(self, lane: str) -> Key | None:
        candidates = [(w.member, key) for key, w in self.waiting.items() if w.offer.lane == lane]
        if self._fair(lane) and candidates:
            tenant = min(self._backlogged(lane), key=lambda t: (self._counter(lane, t), t))
            candidates = [c for c in candidates if self.waiting[c[1]].offer.tenant == tenant]
        return min(candidates)[1] if candidates else None

    def sync(self, replica: str, ops: list[Offer | Drop]) -> tuple[list[str], list[str]]:
        """Apply ``ops`` of ``replica``, fill, preempt: the caller's grants and stops
        (others' go to ``pushed``, stops as ``!<ticket>``)."""
        self.clock += 1
        self._granted, self._stops = [], []
        for op in ops:
            if isinstance(op, Offer):
                self._offer(replica, op)
            else:
                self._drop(replica, op)
        for lane in self.limits.lanes:
            self._fill(replica, lane, lending=False)
        for lane in self.limits.lanes:
            if lane.borrow:
                self._fill(replica, lane, lending=True)
        self._preempt(replica)
        return self._granted, self._stops

    # ------------------------------------------------------------------ fill

    def own(self, lane: str) -> int:
        """Leases of ``lane`` on its own quota."""
        return sum(1 for x in self.leases.values() if x.offer.lane == lane and not x.lent)

    def _borrowed(self) -> int:
        return sum(1 for lease in self.leases.values() if lease.lent)

    def _lendable(self) -> int:
        idle = -self._borrowed()
        for lane in self.limits.lanes:
            if lane.lend and self.own(lane.name) < lane.cap:
                idle += lane.cap - self.own(lane.name)
        return idle

    def _over_budget(self, cost: int) -> bool:
        budget = self.limits.token_budget
        return budget is not None and bool(self.leases) and self.tokens() + cost > budget

    def _fill(self, caller: str, lane: LaneLimits, *, lending: bool) -> None:
        while len(self.leases) < self.limits.cap:
            if lending:
                if self._lendable() <= 0:
                    return
            elif self.own(lane.name) >= lane.cap:
                return
            key = self._best(lane.name)
            if key is None or self._over_budget(self.waiting[key].offer.cost_tokens):
                return
            self._grant(caller, key, lending)

    # ------------------------------------------------------------------ preemption

    def _pending(self, lane: str) -> bool:
        key = self.pending.get(lane)
        if key is None:
            return False
        if key in self.stopping and key in self.leases:
            return True
        del self.pending[lane]
        self.stopping.pop(key, None)
        return False

    def _victim(self, lane: str, offer: Offer, *, reclaim: bool, lane_full: bool) -> Key | None:
        budget = self.limits.token_budget
        for _, _, _, key in self._victim_index():
            if key in self.stopping:
                continue
            lease = self.leases[key]
            victim = lease.offer
            if not reclaim and victim.priority <= offer.priority:
                return None
            ok = victim.preempt_delay_s == 0.0 and lease.admitted < self.clock
            if reclaim:
                ok = ok and lease.lent and victim.lane != lane
            elif lane_full:
                ok = ok and victim.lane == lane and not lease.lent
            if ok and budget is not None and self._over_budget(offer.cost_tokens):
                ok = self.tokens() - victim.cost_tokens + offer.cost_tokens <= budget
            if ok:
                return key
        return None

    def _preempt_for(self, caller: str, lane: str, waiter: Key, *, reclaim: bool) -> None:
        spec = next(x for x in self.limits.lanes if x.name == lane)
        lane_full = not reclaim and self._lane_full(spec)
        key = self._victim(lane, self.waiting[waiter].offer, reclaim=reclaim, lane_full=lane_full)
        if key is None:
            return
        self.stopping[key] = (lane, waiter, not lane_full and self.own(lane) >= spec.cap)
        self.pending[lane] = key
        self._tell(caller, key[0], key[1] if key[0] == caller else "!" + key[1], self._stops)

    def _lane_full(self, lane: LaneLimits) -> bool:
        return self.own(lane.name) >= lane.cap and not (lane.borrow and self._lendable() > 0)

    def _preempt(self, caller: str) -> None:
        limits = self.limits
        if len(self.leases) >= limits.cap and self._borrowed() > 0:
            for lane in limits.lanes:
                if self.own(lane.name) < lane.cap and not self._pending(lane.name):
                    head = self._best(lane.name)
                    if head is not None:
                        self._preempt_for(caller, lane.name, head, reclaim=True)
        for lane in limits.lanes:
            if lane.shares and lane.fair and not self._pending(lane.name):
                self._share_give_back(caller, lane)
        urgent = sorted(
            (milliseconds(w.offer.urgent_at), w.member, key)
            for key, w in self.waiting.items()
            if w.offer.urgent_at is not None and milliseconds(w.offer.urgent_at) <= NOW_MS
        )
        for _, _, key in urgent[:URGENT_PER_SYNC]:
            if key not in self.waiting:
                continue
            offer = self.waiting[key].offer
            lane = next(x for x in limits.lanes if x.name == offer.lane)
            if self._pending(lane.name):
                continue
            if (
                len(self.leases) >= limits.cap
                or self._lane_full(lane)
                or self._over_budget(offer.cost_tokens)
            ):
                self._preempt_for(caller, lane.name, key, reclaim=False)

    def _victim_index(self) -> list[tuple[int, int, str, Key]]:
        """The first ``PREEMPT_SCAN`` of the script's ``pv`` index: preemptible leases by
        priority, admission and key, the highest first."""
        return sorted(
            (
                (x.offer.priority, x.admitted, f"{key[0]}|{key[1]}", key)
                for key, x in self.leases.items()
                if x.offer.preempt_delay_s is not None
            ),
            reverse=True,
        )[:PREEMPT_SCAN]

    def _share_give_back(self, caller: str, lane: LaneLimits) -> None:
        head = self._best(lane.name)
        if head is None:
            return
        offer = self.waiting[head].offer
        if offer.share_from is None or milliseconds(offer.share_from) > NOW_MS:
            return
        limits = self.limits
        fits = not self._over_budget(offer.cost_tokens)
        room = len(self.leases) < limits.cap and (
            self.own(lane.name) < lane.cap or (lane.borrow and self._lendable() > 0)
        )
        if fits and room:
            return
        slots = min(lane.cap, limits.cap)
        counts: dict[str, int] = {}
        for x in self.leases.values():
            if x.offer.lane == lane.name:
                counts[x.offer.tenant] = counts.get(x.offer.tenant, 0) + 1
        weights = {t: self.tenant_weights[(lane.name, t)] for t in counts}
        running_weight = sum(weights.values())
        mine = counts.get(offer.tenant, 0)
        total = running_weight if mine else running_weight + offer.weight
        if (mine + 1) * total > slots * offer.weight:
            return
        over: dict[str, float] = {}
        for other, count in counts.items():
            share = slots * weights[other] / total
            if other != offer.tenant and count - 1 >= share:
                over[other] = count / share
        if not over:
            return
        lowest = max(4, offer.priority) if lane.shares == "priority" else offer.priority
        budget = limits.token_budget
        best: tuple[float, int, str, Key] | None = None
        for priority, admitted, name, key in self._victim_index():
            x = self.leases[key]
            victim = x.offer
            if (
                key not in self.stopping
                and victim.lane == lane.name
                and victim.tenant in over
                and priority >= lowest
                and victim.preempt_delay_s == 0.0
                and admitted < self.clock
                and (
                    fits
                    or (budget is not None
                        and self.tokens() - victim.cost_tokens + offer.cost_tokens <= budget)
                )
            ):  # fmt: skip
                candidate = (over[victim.tenant], admitted, name, key)
                if best is None or candidate[:3] > best[:3]:
                    best = candidate
        if best is None:
            return
        key = best[3]
        self.stopping[key] = (lane.name, head, self.leases[key].lent)
        self.pending[lane.name] = key
        self._tell(caller, key[0], key[1] if key[0] == caller else "!" + key[1], self._stops)

    # ------------------------------------------------------------------ reading

    def tokens(self) -> int:
        """Summed cost of the leases."""
        return sum(lease.offer.cost_tokens for lease in self.leases.values())

    def lane_running(self, lane: str) -> int:
        """Leases in ``lane``."""
        return sum(1 for lease in self.leases.values() if lease.offer.lane == lane)
