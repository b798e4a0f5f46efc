"""Live state of models and lanes: counts, budgets and the per-model collaborators.

The state changes of a model happen here, in the module that owns its counts:
``occupy`` when a ticket takes a slot, ``release`` when it gives it back,
``finish`` when it ends (the slot, its backend's circuit, what it teaches the
predictor and the adaptive limit) and ``bounced`` when its backend refused it.
"""

from __future__ import annotations

from collections.abc import Mapping

from sluicegate.core.backend_state import BackendState
from sluicegate.core.circuit import CircuitBreaker
from sluicegate.core.entry import Entry, State
from sluicegate.core.limits import Limit, make_limit
from sluicegate.core.limits.feedback import report_outcome
from sluicegate.core.policies import ORDERINGS, make_queue
from sluicegate.core.predictor import Predictor
from sluicegate.core.routing import Router, make_router
from sluicegate.core.spec import KV_WATERMARK, LaneSpec, ModelSpec
from sluicegate.core.tenant_share import TenantSlots
from sluicegate.core.ticket import MAX_PRIORITY, BackendStats, Feedback, TicketId, Usage
from sluicegate.core.work_ahead import RemoteWork


class LaneRuntime:
    """One lane's queue and running counts.

    Attributes:
        own: running units on the lane's own quota (never above ``cap``, except one
            ticket of more units than ``cap`` alone). A ticket takes ``ticket.units``
            units of every count here and in ``ModelRuntime`` (its ``n`` choices).
        borrowed: running units on capacity borrowed from other lanes.
        pending_preempts: preemptions issued on behalf of this lane, not yet freed.
        order: the lane ordering's key of an entry (what distributed mode sends the store).
        shares: running units per tenant, for the tenants' shares of the lane's slots
            (lanes with ``vtc`` fairness only; ``None`` otherwise).
        remote: distributed mode: the other replicas' work in the lane, for its start
            estimate (``core/estimate.py``; ``None``: none known).
    """

    __slots__ = (
        "borrow",
        "borrowed",
        "cap",
        "ceiling",
        "order",
        "own",
        "pending_preempts",
        "queue",
        "remote",
        "shares",
        "spec",
    )

    def __init__(self, spec: LaneSpec, weights: Mapping[str, float]) -> None:
        self.spec = spec
        self.cap = spec.max_concurrency
        # Cluster pressure's cap for the lane (``None``: not tightened); a tightened
        # lane borrows nothing, so ``borrow`` is the spec's unless tightened.
        self.ceiling: int | None = None
        self.borrow = spec.borrow
        ordering, fairness = spec.queue_policy
        self.queue = make_queue(ordering, fairness, aging=spec.aging, weights=weights)
        self.order = ORDERINGS.get(ordering)(spec.aging).key
        self.shares = TenantSlots(weights) if fairness == "vtc" else None
        self.own = 0
        self.borrowed = 0
        self.pending_preempts = 0
        self.remote: RemoteWork | None = None

    @property
    def running(self) -> int:
        """All running tickets of the lane, own and borrowed."""
        return self.own + self.borrowed


class ModelRuntime:
    """One model's lanes, backends, budgets, router, adaptive limit and predictor."""

    __slots__ = (
        "backend_by_name",
        "backend_slots",
        "backends",
        "borrowed_running",
        "ceilings",
        "has_victims",
        "inflight_tokens",
        "kv_capacity",
        "lane_order",
        "lanes",
        "limit",
        "max_concurrency",
        "predictor",
        "router",
        "running",
        "running_by_priority",
        "running_entries",
        "share",
        "spec",
        "token_budget",
        "wakeup",
    )

    def __init__(self, spec: ModelSpec, weights: Mapping[str, float]) -> None:
        self.spec = spec
        self.lane_order = [LaneRuntime(lane, weights) for lane in spec.lanes]
        self.lanes = {lane.spec.name: lane for lane in self.lane_order}
        # Whether any lane's tickets may ever be preempted: if none, no waiter turns urgent.
        self.has_victims = any(lane.preemptible != "never" for lane in spec.lanes)
        self.backends = [
            BackendState(
                backend,
                CircuitBreaker(failures=spec.circuit_failures, cooldown_s=spec.circuit_cooldown_s),
                # "auto" is resolved by the gateway's config (5 scrape intervals); a
                # scheduler built without one (the simulator) has no scrape to go stale.
                None if spec.metrics_stale_after_s == "auto" else spec.metrics_stale_after_s,
            )
            for backend in spec.backends
        ]
        self.backend_by_name = {backend.spec.name: backend for backend in self.backends}
        caps = [backend.max_concurrency for backend in spec.backends]
        # Slots the backends offer in all, when every one is capped (llama.cpp: 1 each).
        self.backend_slots: int | None = (
            sum(c for c in caps if c is not None) if caps and None not in caps else None
        )
        self.router: Router = make_router(spec.router, self.backends, spec.prefix_routing)
        self.limit: Limit | None = (
            make_limit(spec.adaptive, spec.max_concurrency) if spec.adaptive is not None else None
        )
        self.predictor = Predictor(spec)
        self.max_concurrency = spec.max_concurrency
        self.share = 1.0
        self.ceilings: Mapping[str, int] = {}
        self.running = 0
        self.borrowed_running = 0
        self.inflight_tokens = 0
        # Each backend's reported KV capacity in tokens, for an ``auto`` budget.
        self.kv_capacity: dict[str, int] = {}
        configured = spec.max_inflight_tokens
        self.token_budget: int | None = configured if isinstance(configured, int) else None
        self.running_entries: dict[TicketId, Entry] = {}
        self.running_by_priority = [0] * (MAX_PRIORITY + 1)
        self.wakeup: float | None = None

    def cap(self) -> int:
        """The effective model-wide concurrency: the configured cap or the adaptive limit."""
        if self.limit is None:
            return self.max_concurrency
        return min(self.max_concurrency, self.limit.value)

    def runs_less_important_than(self, priority: int) -> bool:
        """Whether any running ticket has a numerically higher (less important) priority."""
        return any(self.running_by_priority[priority + 1 :])

    def lendable(self) -> int:
        """Idle own-quota of lending lanes not already lent out."""
        idle = -self.borrowed_running
        for lane in self.lane_order:
            if lane.spec.lend and lane.own < lane.cap:
                idle += lane.cap - lane.own
        return idle

    def observe(self, stats: BackendStats, now: float) -> None:
        """Record a health probe or metrics scrape of one backend: its health, queue
        counts and KV cache use (which an adaptive ``kv_cache`` limit follows, a stale
        backend's read as full)."""
        backend = self.backend(stats.backend)
        if stats.scraped:
            backend.metrics_at = now
        if stats.healthy is not None:
            backend.probe_healthy = stats.healthy
        backend.circuit.advance(now)
        if stats.num_requests_running is not None:
            backend.num_requests_running = stats.num_requests_running
        if stats.num_requests_waiting is not None:
            backend.num_requests_waiting = stats.num_requests_waiting
        if stats.kv_capacity_tokens is not None:
            self.set_kv_capacity(backend.name, stats.kv_capacity_tokens)
        if stats.kv_cache_usage is not None:
            backend.kv_cache_usage = stats.kv_cache_usage
            if self.limit is not None:
                readings = [
                    1.0 if b.metrics_stale(now) else b.kv_cache_usage
                    for b in self.backends
                    if b.kv_cache_usage is not None
                ]
                self.limit.on_kv_usage(sum(readings) / len(readings), inflight=self.running)

    def set_kv_capacity(self, backend: str, tokens: int) -> None:
        """Record ``backend``'s KV capacity; an ``auto`` budget follows once all are known.

        The derived budget is the sum of every backend's capacity times
        ``KV_WATERMARK``; while any backend's capacity is unknown there is none.
        """
        self.kv_capacity[backend] = tokens
        self._set_budget()

    def _set_budget(self) -> None:
        """The token budget at ``share``: configured, or derived once every KV capacity is
        known (``auto``), else none."""
        configured = self.spec.max_inflight_tokens
        if isinstance(configured, int):
            self.token_budget = max(1, int(configured * self.share))
        elif configured == "auto" and len(self.kv_capacity) == len(self.backends):
            total = sum(self.kv_capacity.values())
            self.token_budget = max(1, int(total * KV_WATERMARK * self.share))

    def set_share(self, share: float) -> None:
        """Enforce ``share`` (0–1] of every configured cap and budget: what a replica keeps
        of the global limits while the shared store is unavailable (1 restores them)."""
        self.share = share
        self.max_concurrency = max(1, int(self.spec.max_concurrency * share))
        self._set_lane_caps()
        self._set_budget()

    def set_ceilings(self, ceilings: Mapping[str, int]) -> None:
        """Tighten the lanes named in ``ceilings`` to their caps there (cluster pressure);
        every other lane is back to its configured cap (at the present share)."""
        self.ceilings = ceilings
        for lane in self.lane_order:
            lane.ceiling = ceilings.get(lane.spec.name)
            lane.borrow = lane.spec.borrow and lane.ceiling is None
        self._set_lane_caps()

    def _set_lane_caps(self) -> None:
        for lane in self.lane_order:
            cap = max(1, int(lane.spec.max_concurrency * self.share))
            lane.cap = cap if lane.ceiling is None else min(cap, lane.ceiling)

    def tokens_fit(self, entry: Entry) -> bool:
        """Whether ``entry`` fits the in-flight token budget (always, when nothing runs)."""
        budget = self.token_budget
        return (
            budget is None
            or self.running == 0
            or (self.inflight_tokens + entry.cost_tokens <= budget)
        )

    def backend(self, name: str) -> BackendState:
        """The backend called ``name``; ``KeyError`` if there is none."""
        return self.backend_by_name[name]

    def units_fit(self, lane: LaneRuntime, entry: Entry, borrowing: bool) -> bool:
        """Whether ``entry``'s units fit the model's effective cap and its lane's own quota
        (or, ``borrowing``, the idle quota lent out). A ticket of more units than a cap
        fits when nothing else holds that capacity, so it is never stuck."""
        units = entry.ticket.units
        if units == 1:
            return True  # the callers checked that one unit is free
        running = self.running
        if running and running + units > self.cap():
            return False
        if borrowing:
            return self.lendable() >= units
        return not lane.own or lane.own + units <= lane.cap

    def lane_has_room(self, lane: LaneRuntime) -> bool:
        """Whether a ticket of ``lane`` could take a slot now (own quota or borrowed)."""
        if self.running >= self.cap():
            return False
        return lane.own < lane.cap or (lane.borrow and self.lendable() > 0)

    def lane_slots(self, lane: LaneRuntime) -> int:
        """``lane``'s effective concurrency, at least 1: its cap, the model's effective cap
        (with the adaptive limit) and the backends' summed caps when every backend is
        capped. Borrowed capacity is not counted."""
        slots = min(lane.cap, self.cap())
        if self.backend_slots is not None:
            slots = min(slots, self.backend_slots)
        return max(1, slots)

    def drain_estimate_s(self, lane: LaneRuntime) -> float:
        """Time for ``lane``'s queue (plus one) to drain at the lane's observed service rate."""
        mean_s = self.predictor.mean_service_s(lane.spec.name)
        return (len(lane.queue) + 1) * mean_s / self.lane_slots(lane)

    def occupy(
        self, lane: LaneRuntime, entry: Entry, backend: BackendState, borrowing: bool, now: float
    ) -> None:
        """Count ``entry`` (just taken out of ``lane``'s queue) as running on ``backend``.

        It takes an own slot of its lane, or a borrowed one when ``borrowing``;
        its tokens join the budget, its predicted work and uncached prompt the backend's.
        """
        lane.queue.on_admit(entry)
        entry.state = State.RUNNING
        entry.admitted_at = now
        entry.backend = backend.spec.name
        entry.borrowed = borrowing
        ticket = entry.ticket
        units = ticket.units
        if borrowing:
            lane.borrowed += units
            self.borrowed_running += units
        else:
            lane.own += units
        if lane.shares is not None:
            lane.shares.add(ticket.tenant, units)
        self.running += units
        self.inflight_tokens += entry.cost_tokens
        self.running_entries[ticket.id] = entry
        self.running_by_priority[ticket.priority] += units
        backend.inflight += units
        backend.predicted_work_s += entry.service_s
        uncached = backend.uncached_tokens(ticket, self.spec.prefix_routing.block_tokens)
        entry.prefill_tokens = uncached
        backend.prefill_backlog_tokens += uncached
        entry.prefill_ahead = backend.prefill_backlog_tokens
        backend.circuit.on_dispatch(now)

    def release(self, entry: Entry, completion_tokens: int, *, served: bool = True) -> None:
        """Undo ``occupy``: give back the slot, tokens and backend share ``entry`` holds.

        The lane's queue is told what the ticket was served (for fair share):
        its prompt and ``completion_tokens``, or nothing when not ``served``.
        """
        lane = self.lanes[entry.ticket.lane]
        units = entry.ticket.units
        if entry.borrowed:
            lane.borrowed -= units
            self.borrowed_running -= units
        else:
            lane.own -= units
        if lane.shares is not None:
            lane.shares.remove(entry.ticket.tenant, units)
        self.running -= units
        self.inflight_tokens -= entry.cost_tokens
        del self.running_entries[entry.ticket.id]
        self.running_by_priority[entry.ticket.priority] -= units
        backend = self.backend(entry.backend)
        backend.inflight -= units
        backend.predicted_work_s -= entry.service_s
        if backend.inflight == 0:
            backend.predicted_work_s = 0.0
        backend.prefill_backlog_tokens -= entry.prefill_tokens
        entry.prefill_tokens = 0
        if entry.preempted_for is not None:
            self.lanes[entry.preempted_for].pending_preempts -= 1
            entry.preempted_for = None
        prompt_tokens = entry.ticket.prompt_tokens if served else 0
        lane.queue.on_finish(entry, prompt_tokens, completion_tokens)

    def finish(self, entry: Entry, usage: Usage, now: float, *, learn: bool) -> None:
        """A running ``entry`` ended with ``usage``: ``release`` its slot, tell its backend's
        circuit how the request went (``usage.ok``; ``None``: unknown, e.g. the client
        left) and, when ``learn`` (it was not preempted), teach the predictor and the
        adaptive limit what it did."""
        self.release(entry, usage.completion_tokens)
        circuit = self.backend(entry.backend).circuit
        if usage.ok is None:
            circuit.on_unknown()
        elif usage.ok:
            circuit.on_success()
        else:
            circuit.on_failure(now)
        if learn:
            self._learn(entry, usage, now)

    def bounced(self, entry: Entry, now: float) -> None:
        """Running ``entry``'s backend refused its connection before anything was sent:
        give its slot back teaching nothing (not served) and open the backend's circuit."""
        self.release(entry, 0, served=False)
        self.backend(entry.backend).circuit.trip(now)

    def _learn(self, entry: Entry, usage: Usage, now: float) -> None:
        """Feed a finished, not preempted, request to the predictor and the limit.

        The predictor learns only from answers the engine gave in full (``Feedback.SAMPLE``):
        a client's 4xx, a disconnect or an engine's 429 says nothing about output lengths.
        A ticket of several units (``n`` choices) teaches what one choice did: its share
        of ``max_tokens`` and of the tokens generated, in the time they took side by side.
        """
        ticket = entry.ticket
        units = ticket.units
        if units > 1:
            usage = Usage(
                usage.prompt_tokens,
                usage.completion_tokens // units,
                ttft_s=usage.ttft_s,
                ok=usage.ok,
                feedback=usage.feedback,
            )
        if usage.limit_feedback is Feedback.SAMPLE:
            self.predictor.observe(
                lane=ticket.lane,
                max_tokens=max(1, ticket.max_tokens // units),
                prompt_tokens=usage.prompt_tokens,
                completion_tokens=usage.completion_tokens,
                ttft_s=usage.ttft_s,
                duration_s=now - entry.admitted_at,
            )
            if usage.ttft_s is not None:
                self.backend(entry.backend).learn_prefill_rate(entry.prefill_ahead, usage.ttft_s)
        if self.limit is not None:
            report_outcome(
                self.limit, usage, elapsed_s=now - entry.admitted_at, inflight=self.running + units
            )
