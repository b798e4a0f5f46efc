"""Hypothesis state machine: the scheduler's invariants hold under any interleaving of events.

A model driver executes every decision the way the gateway does (Admit → running,
Preempt → stop then complete, Reserve → a grant from the "store" later, in any order)
and checks after every step that caps, budgets and the ticket ledger agree with the
scheduler. The store comes and goes: distributed mode, fail open, fail closed.
"""

from __future__ import annotations

import math
from collections import Counter
from typing import Any

from hypothesis import event
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from sluicegate.core import (
    AdaptiveSpec,
    Admit,
    AfterFraction,
    BackendSpec,
    BackendStats,
    Decision,
    ErrorCode,
    Expire,
    LaneSpec,
    ModelSpec,
    Preempt,
    PreemptAction,
    Queued,
    Reject,
    Reserve,
    Scheduler,
    SchedulerSpec,
    TenantSpec,
    Ticket,
    TicketId,
    Usage,
)
from sluicegate.core.policies import FAIRNESS, POLICY_ALIASES, policy_names
from sluicegate.core.preemption import ever_preemptible
from sluicegate.core.ratelimit import TenantRateLimiter
from tests.core.conftest import machine_settings

MODEL = "m"
TENANTS = ("alice", "bob", "carol")
QUEUE_POLICIES = [
    (policy, fairness)
    for policy in sorted(policy_names())
    for fairness in (None, *FAIRNESS)
    if fairness is None or policy not in POLICY_ALIASES
]
"""Every (policy, fairness) a lane accepts: each ordering with each fairness, and ``fair``."""
REJECT_STATUS = {
    ErrorCode.QUEUE_FULL: 429,
    ErrorCode.RATE_LIMIT_EXCEEDED: 429,
    ErrorCode.OVERLOADED: 503,
    ErrorCode.DRAINING: 503,
    ErrorCode.NO_HEALTHY_BACKEND: 503,
    ErrorCode.STORE_UNAVAILABLE: 503,
}
"""The HTTP status each refusal code comes with (``queue_timeout`` is an ``Expire``)."""


def _lanes(
    policies: list[tuple[str, str | None]], borrow: list[bool], requeue: bool
) -> tuple[LaneSpec, ...]:
    action = "requeue" if requeue else "abort"
    shapes: list[tuple[str, int, int, float, float, dict[str, Any]]] = [
        # name, max_concurrency, max_queue, queue_timeout_s, slo_ms, the rest
        ("interactive", 2, 6, 5.0, 3_000.0, {"preemptible": "never"}),
        ("batch", 2, 8, 20.0, 10_000.0, {
            "preemptible": AfterFraction(after_fraction=0.5), "preempt_action": action,
        }),
        ("best_effort", 1, 8, 30.0, 60_000.0, {
            "preemptible": "priority", "preempt_action": action, "max_requeues": 2, "lend": False,
        }),
    ]  # fmt: skip
    return tuple(
        LaneSpec(
            name=name,
            max_concurrency=cap,
            max_queue=queue,
            queue_timeout_s=timeout_s,
            slo_ms=slo_ms,
            policy=policy,
            fairness=fairness,
            borrow=may_borrow,
            **rest,
        )
        for (name, cap, queue, timeout_s, slo_ms, rest), (policy, fairness), may_borrow in zip(
            shapes, policies, borrow, strict=True
        )
    )


class SchedulerMachine(RuleBasedStateMachine):
    """Random submits, completes, cancels, ticks, observations and global-slot answers."""

    def __init__(self) -> None:
        super().__init__()
        self.now = 0.0
        self.n = 0
        self.ended: Counter[str] = Counter()
        self.submitted: set[str] = set()
        self.queued: set[str] = set()
        self.offered: set[str] = set()  # queued and offered to the store
        self.caps_moved = False  # a store mode ran: shared grants, or caps cut to a share
        self.running: dict[str, str] = {}
        self.preempting: set[str] = set()
        self.tickets: dict[str, Ticket] = {}
        self.budget: int | None = None
        self.reentered: set[str] = set()  # queued again after a requeue

    @initialize(
        policies=st.lists(st.sampled_from(QUEUE_POLICIES), min_size=3, max_size=3),
        borrow=st.lists(st.booleans(), min_size=3, max_size=3),
        requeue=st.booleans(),
        budget=st.sampled_from([None, 2_000]),
        adaptive=st.booleans(),
        max_priority=st.lists(st.sampled_from([0, 0, 1, 2, 3, 4]), min_size=3, max_size=3),
    )
    def setup(
        self,
        policies: list[tuple[str, str | None]],
        borrow: list[bool],
        requeue: bool,
        budget: int | None,
        adaptive: bool,
        max_priority: list[int],
    ) -> None:
        self.budget = budget
        model = ModelSpec(
            name=MODEL,
            backends=(BackendSpec(name="b0", max_concurrency=3), BackendSpec(name="b1")),
            lanes=_lanes(policies, borrow, requeue),
            max_concurrency=4,
            max_inflight_tokens=budget,
            adaptive=AdaptiveSpec(mode="kv_cache", floor=1) if adaptive else None,
            circuit_failures=2,
            circuit_cooldown_s=1.0,
        )
        tenants = (
            TenantSpec(name="alice", weight=2.0, max_priority=max_priority[0]),
            TenantSpec(
                name="bob", requests_per_s=2.0, tokens_per_min=30_000.0,
                max_priority=max_priority[1],
            ),
            TenantSpec(name="carol", max_priority=max_priority[2]),
        )  # fmt: skip
        self.tenants = tenants
        self.model = model
        self.most_important = min(max_priority)
        self.s = Scheduler(SchedulerSpec(models=(model,), tenants=tenants))

    # ------------------------------------------------------------------ driver

    def _end(self, tid: str) -> None:
        self.ended[tid] += 1
        assert self.ended[tid] == 1, f"ticket {tid} ended twice"
        self.queued.discard(tid)
        self.reentered.discard(tid)
        self.running.pop(tid, None)
        self.offered.discard(tid)
        self.preempting.discard(tid)

    def _apply(self, decisions: list[Decision]) -> None:
        for d in decisions:
            tid = d.ticket.id
            event(type(d).__name__)
            if isinstance(d, Admit):
                assert tid in self.queued, f"{tid} admitted from nowhere"
                self.queued.discard(tid)
                self.reentered.discard(tid)
                self.offered.discard(tid)
                self.running[tid] = d.backend
            elif isinstance(d, Reserve):
                assert tid in self.queued
                assert self.s.shared
                self.offered.add(tid)
            elif isinstance(d, Queued):
                self.queued.add(tid)
            elif isinstance(d, Reject):
                assert 0.001 <= d.retry_after_s < math.inf
                assert d.status == REJECT_STATUS[d.code], d
                self._end(tid)
            elif isinstance(d, Expire):
                assert tid in self.queued
                assert 0.001 <= d.retry_after_s < math.inf
                self._end(tid)
            elif isinstance(d, Preempt):
                assert tid in self.running, f"preempted {tid} is not running"
                assert d.ticket.priority >= 2 or d.ticket.lane != "interactive"
                # The gateway sends a ticket judged never preemptible as it came.
                lane = self.model.lane(d.ticket.lane)
                assert ever_preemptible(
                    self.model, lane, d.ticket.priority, self.most_important,
                    streaming=d.ticket.streaming,
                )  # fmt: skip
                if d.action is PreemptAction.REQUEUE:
                    assert not d.ticket.streaming
                self.preempting.add(tid)

    def _complete(self, tid: str, usage: Usage) -> None:
        """Complete a running ticket; a preempted one with action requeue waits again."""
        was_preempting = tid in self.preempting
        decisions = self.s.complete(TicketId(tid), usage, self.now)
        if was_preempting and self.s.state_of(TicketId(tid)) is not None:
            self.running.pop(tid)
            self.preempting.discard(tid)
            self.queued.add(tid)
            self.reentered.add(tid)
        else:
            assert self.s.state_of(TicketId(tid)) is None
            self._end(tid)
        self._apply(decisions)

    def _advance(self, dt: float) -> None:
        self.now += dt

    # ------------------------------------------------------------------ rules

    @rule(
        lane=st.sampled_from(["interactive", "batch", "best_effort"]),
        tenant=st.sampled_from(TENANTS),
        priority=st.integers(0, 5),
        prompt=st.integers(0, 1_500),
        max_tokens=st.integers(1, 800),
        streaming=st.booleans(),
        dt=st.floats(0.0, 2.0),
        units=st.sampled_from([1, 1, 1, 2, 3, 5]),
    )
    def submit(
        self,
        lane: str,
        tenant: str,
        priority: int,
        prompt: int,
        max_tokens: int,
        streaming: bool,
        dt: float,
        units: int,
    ) -> None:
        self._advance(dt)
        self.n += 1
        tid = TicketId(f"t{self.n}")
        # As the gateway classifies: never more important than the tenant may ask.
        priority = max(priority, next(t for t in self.tenants if t.name == tenant).max_priority)
        ticket = Ticket(
            id=tid,
            model=MODEL,
            tenant=tenant,
            lane=lane,
            priority=priority,
            prompt_tokens=prompt,
            max_tokens=max_tokens,
            arrival=self.now,
            streaming=streaming,
            true_output_tokens=max_tokens // 2 + 1,
            units=units,
        )
        self.tickets[tid] = ticket
        self.submitted.add(tid)
        self.queued.add(tid)  # until a decision says otherwise
        decisions = self.s.submit(ticket, self.now)
        own = [d for d in decisions if d.ticket.id == tid and not isinstance(d, Reserve)]
        assert len(own) == 1, f"submit must decide once about the new ticket: {own}"
        offers = [d for d in decisions if isinstance(d, Reserve)]
        offered_now = self.s.shared and isinstance(own[0], Queued)
        assert [d.ticket.id for d in offers] == ([tid] if offered_now else [])
        self._apply(decisions)

    @precondition(lambda self: bool(self.running))
    @rule(data=st.data(), ok=st.sampled_from([True, False, None]), dt=st.floats(0.0, 3.0))
    def complete(self, data: st.DataObject, ok: bool | None, dt: float) -> None:
        self._advance(dt)
        tid = data.draw(st.sampled_from(sorted(self.running)))
        ticket = self.tickets[tid]
        tokens = data.draw(st.integers(0, ticket.max_tokens))
        self._complete(tid, Usage(ticket.prompt_tokens, tokens, ttft_s=0.05, ok=ok))

    @precondition(lambda self: bool(self.running))
    @rule(data=st.data(), dt=st.floats(0.0, 3.0))
    def bounce(self, data: st.DataObject, dt: float) -> None:
        """A running ticket's backend refused its connection: the backend is down at once,
        and the ticket queues again or ends with one ``Expire`` (503)."""
        self._advance(dt)
        tid = data.draw(st.sampled_from(sorted(self.running)))
        backend = self.running.pop(tid)
        self.preempting.discard(tid)
        decisions = self.s.bounce(TicketId(tid), self.now)
        view = self.s.view(MODEL, self.now)
        assert next(b for b in view.backends if b.name == backend).circuit == "open"
        assert not any(isinstance(d, Admit) and d.backend == backend for d in decisions)
        own = [d for d in decisions if d.ticket.id == tid and isinstance(d, Expire)]
        self.queued.add(tid)
        if self.s.state_of(TicketId(tid)) is None:
            event(f"bounce: {own[0].code.value}" if own else "bounce: no Expire")
            assert len(own) == 1, decisions
        else:
            event("bounce: queued again")
            assert own == []
            self.reentered.add(tid)
        self._apply(decisions)

    @precondition(lambda self: bool(self.running))
    @rule(data=st.data())
    def report_progress(self, data: st.DataObject) -> None:
        tid = data.draw(st.sampled_from(sorted(self.running)))
        self.s.progress(TicketId(tid), data.draw(st.integers(0, self.tickets[tid].max_tokens)))

    @precondition(lambda self: bool(self.queued or self.running))
    @rule(data=st.data(), dt=st.floats(0.0, 1.0))
    def cancel(self, data: st.DataObject, dt: float) -> None:
        self._advance(dt)
        live = sorted(self.queued | set(self.running))
        tid = data.draw(st.sampled_from(live))
        decisions = self.s.cancel(TicketId(tid), self.now)
        self._end(tid)
        self._apply(decisions)

    @rule(dt=st.floats(0.0, 10.0))
    def tick(self, dt: float) -> None:
        self._advance(dt)
        self._apply(self.s.tick(self.now))

    @rule()
    def tick_at_wakeup(self) -> None:
        wakeup = self.s.next_wakeup()
        if wakeup is not None and wakeup > self.now:
            self.now = wakeup
        self._apply(self.s.tick(self.now))

    @precondition(lambda self: bool(self.offered))
    @rule(data=st.data())
    def grant(self, data: st.DataObject) -> None:
        """The store grants one offered ticket (any of them, in any order)."""
        tid = data.draw(st.sampled_from(sorted(self.offered)))
        decisions = self.s.grant(TicketId(tid), self.now)
        if not self.s.shared:
            assert decisions == [], "only distributed mode admits on a grant"
        self._apply(decisions)

    @precondition(lambda self: bool(self.submitted))
    @rule(data=st.data())
    def stale_grant(self, data: st.DataObject) -> None:
        """A grant for a ticket that ended or runs gives nothing."""
        gone = sorted((set(self.ended) | set(self.running)) - self.preempting)
        if gone:
            tid = data.draw(st.sampled_from(gone))
            assert self.s.grant(TicketId(tid), self.now) == []

    @rule(mode=st.sampled_from(["use", "fail_open", "fail_closed"]))
    def store(self, mode: str) -> None:
        """The shared store comes back, or fails (open at half the limits, or closed)."""
        self.caps_moved = True
        if mode == "use":
            decisions = self.s.use_store(self.now)
            assert {d.ticket.id for d in decisions} == self.queued
            assert all(isinstance(d, Reserve) for d in decisions)
        else:
            self.offered.clear()
            rates = TenantRateLimiter(self.tenants)
            decisions = self.s.lose_store(
                self.now, fail_open=mode == "fail_open", share=0.5, rate_limiter=rates
            )
            if mode == "fail_closed":
                assert all(
                    isinstance(d, Expire) and d.code is ErrorCode.STORE_UNAVAILABLE
                    for d in decisions
                )
                assert {d.ticket.id for d in decisions} == self.queued
        self._apply(decisions)

    @rule(
        backend=st.sampled_from(["b0", "b1"]),
        healthy=st.none() | st.booleans(),
        kv=st.none() | st.floats(0.0, 1.0),
        dt=st.floats(0.0, 2.0),
    )
    def observe(self, backend: str, healthy: bool | None, kv: float | None, dt: float) -> None:
        self._advance(dt)
        stats = BackendStats(MODEL, backend, healthy=healthy, kv_cache_usage=kv)
        self._apply(self.s.observe_backend(stats, self.now))

    # ------------------------------------------------------------------ invariants

    @invariant()
    def caps_hold(self) -> None:
        view = self.s.view(MODEL)
        units = {tid: self.tickets[tid].units for tid in self.running}
        assert view.running == sum(units.values())
        # A ticket of more units than a cap runs only alone there (it is never stuck).
        lone = len(self.running) == 1
        if self.caps_moved:
            # The store's grants bind the caps then, and a fail-open share cuts caps under
            # tickets already running: local admission respects them, the counts may not.
            return
        for lane in view.lanes:
            mine = {u for tid, u in units.items() if self.tickets[tid].lane == lane.name}
            assert lane.own <= lane.cap or lane.own in mine, f"{lane.name} own {lane.own}"
            # max_queue bounds new arrivals; an accepted ticket preempted with requeue
            # may come back on top of it.
            back = sum(1 for tid in self.reentered if self.tickets[tid].lane == lane.name)
            assert lane.queued <= max(lane.max_queue, 1) + back
        spec = self.s.spec.models[0]
        for lane_spec, lane in zip(spec.lanes, view.lanes, strict=True):
            if not lane_spec.borrow:
                assert lane.borrowed == 0, f"{lane.name} borrowed without permission"
        assert view.running <= view.configured_cap or lone
        if self.budget is not None and view.inflight_tokens > self.budget:
            assert lone, "only a lone oversized request may exceed the budget"
        for backend in view.backends:
            assert backend.inflight >= 0
        on_b0 = [units[tid] for tid, backend in self.running.items() if backend == "b0"]
        assert sum(on_b0) <= 3 or len(on_b0) == 1
        assert view.backends[0].inflight == sum(on_b0)

    @invariant()
    def ledger_agrees(self) -> None:
        live = self.queued | set(self.running)
        assert self.s.live_tickets() == len(live)
        assert self.s.view(MODEL).queued == len(self.queued)
        assert not (set(self.ended) & live)

    def teardown(self) -> None:
        if not hasattr(self, "s"):
            return
        for _ in range(10_000):
            if self.offered and self.s.shared:
                for tid in sorted(self.offered):
                    self._apply(self.s.grant(TicketId(tid), self.now))
            if self.running:
                self.now += 1.0
                self._complete(sorted(self.running)[0], Usage(1, 1))
            elif self.queued:
                if self.s.shared:
                    self.offered.clear()
                    self._apply(self.s.lose_store(self.now, fail_open=True, share=1.0))
                self.now += 100.0
                for backend in ("b0", "b1"):
                    stats = BackendStats(MODEL, backend, healthy=True, kv_cache_usage=0.0)
                    self._apply(self.s.observe_backend(stats, self.now))
                self._apply(self.s.tick(self.now))
            else:
                break
        view = self.s.view(MODEL)
        assert self.s.live_tickets() == 0
        assert view.running == 0
        assert view.queued == 0
        assert view.inflight_tokens == 0
        assert all(b.inflight == 0 for b in view.backends)
        assert all(lane.own == 0 and lane.borrowed == 0 for lane in view.lanes)
        assert set(self.ended) == self.submitted
        assert all(count == 1 for count in self.ended.values())


SchedulerMachine.TestCase.settings = machine_settings(max_examples=300)
TestSchedulerInvariants = SchedulerMachine.TestCase
