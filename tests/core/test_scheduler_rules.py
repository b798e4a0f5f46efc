"""Scheduler rules (DESIGN §4–§7): timeouts, rejections, caps, borrowing, preemption, health.

Every test drives the real ``Scheduler`` with explicit ``now`` values. Lanes
come from the ``make_lane`` fixture (cap 1, fifo, never preemptible, hour-long
timeouts unless overridden).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TypeVar

import pytest

from sluicegate.core.decisions import (
    Admit,
    Decision,
    ErrorCode,
    Expire,
    Preempt,
    PreemptAction,
    Queued,
    Reject,
    Reserve,
)
from sluicegate.core.entry import State
from sluicegate.core.scheduler import Scheduler
from sluicegate.core.spec import AdaptiveSpec, TenantSpec
from sluicegate.core.ticket import BackendStats, Ticket, TicketId, Usage
from tests.core.conftest import LaneFactory, SpecFactory, TicketFactory

MODEL = "m"
LANE = "main"
OK = Usage(prompt_tokens=100, completion_tokens=10)


D = TypeVar("D", Admit, Queued, Reject, Expire, Preempt, Reserve)


def only(decisions: Sequence[Decision], kind: type[D]) -> list[D]:
    """The decisions of one kind, in order."""
    return [d for d in decisions if isinstance(d, kind)]


def the_reject(decisions: Sequence[Decision]) -> Reject:
    """The single decision, which must be a ``Reject``."""
    assert len(decisions) == 1
    (reject,) = only(decisions, Reject)
    return reject


def ids(decisions: Sequence[Decision], kind: type[Decision]) -> list[str]:
    """Ids of the tickets in decisions of one kind."""
    return [d.ticket.id for d in decisions if isinstance(d, kind)]


# ---------------------------------------------------------------------------- queue timeout


def test_queue_timeout_expires_exactly_at_deadline(
    make_spec: SpecFactory, make_lane: LaneFactory, make_ticket: TicketFactory
) -> None:
    """A queued ticket expires at enqueued_at + queue_timeout_s, not a microsecond before."""
    sched = Scheduler(make_spec(make_lane(queue_timeout_s=5.0)))
    sched.submit(make_ticket("run"), 0.0)
    waiter = make_ticket("wait", arrival=2.0)
    assert only(sched.submit(waiter, 2.0), Queued)
    assert only(sched.tick(7.0 - 1e-6), Expire) == []
    assert sched.state_of(waiter.id) is State.QUEUED
    (expire,) = only(sched.tick(7.0), Expire)
    assert expire.ticket == waiter
    assert 0.001 <= expire.retry_after_s < math.inf
    assert sched.state_of(waiter.id) is None


def test_next_wakeup_reports_queue_timeout(
    make_spec: SpecFactory, make_lane: LaneFactory, make_ticket: TicketFactory
) -> None:
    """next_wakeup() is the earliest queue expiry: enqueued_at + queue_timeout_s."""
    sched = Scheduler(make_spec(make_lane(queue_timeout_s=5.0)))
    sched.submit(make_ticket("run"), 0.0)
    assert sched.next_wakeup() is None
    sched.submit(make_ticket("wait", arrival=2.0), 2.0)
    assert sched.next_wakeup() == 7.0


# ---------------------------------------------------------------------------- queue limits


def test_full_queue_rejects_with_429(
    make_spec: SpecFactory, make_lane: LaneFactory, make_ticket: TicketFactory
) -> None:
    """A lane whose queue holds max_queue tickets rejects the next with 429 queue_full."""
    sched = Scheduler(make_spec(make_lane(max_queue=2)))
    for name in ("run", "q1", "q2"):
        assert not only(sched.submit(make_ticket(name), 0.0), Reject)
    reject = the_reject(sched.submit(make_ticket("q3"), 0.0))
    assert (reject.status, reject.code) == (429, ErrorCode.QUEUE_FULL)
    assert 0.001 <= reject.retry_after_s < math.inf
    assert sched.lane_view(MODEL, LANE).queued == 2


def test_zero_queue_lane_admits_when_free(
    make_spec: SpecFactory, make_lane: LaneFactory, make_ticket: TicketFactory
) -> None:
    """A max_queue=0 lane runs a ticket at once when it has a free slot."""
    sched = Scheduler(make_spec(make_lane(max_queue=0)))
    assert ids(sched.submit(make_ticket("a"), 0.0), Admit) == ["a"]


@pytest.mark.parametrize(
    ("lane_cap", "model_cap"),
    [pytest.param(1, 8, id="lane-busy"), pytest.param(4, 1, id="model-busy")],
)
def test_zero_queue_lane_rejects_when_busy(
    lane_cap: int,
    model_cap: int,
    make_spec: SpecFactory,
    make_lane: LaneFactory,
    make_ticket: TicketFactory,
) -> None:
    """A max_queue=0 lane at its own cap rejects with queue_full (it has no queue to wait in),
    even though the model as a whole still has room; so does one whose model is at its cap."""
    lane = make_lane(max_queue=0, max_concurrency=lane_cap)
    sched = Scheduler(make_spec(lane, max_concurrency=model_cap))
    sched.submit(make_ticket("a"), 0.0)
    reject = the_reject(sched.submit(make_ticket("b"), 0.0))
    assert (reject.status, reject.code) == (429, ErrorCode.QUEUE_FULL)
    assert sched.lane_view(MODEL, LANE).queued == 0


# ---------------------------------------------------------------------------- rate limits


def test_request_rate_limit_rejects_with_retry_after(
    make_spec: SpecFactory, make_lane: LaneFactory, make_ticket: TicketFactory
) -> None:
    """Over requests_per_s → 429 rate_limit_exceeded, retry-after = time to refill one request."""
    tenant = TenantSpec(name="t", requests_per_s=0.25, burst_requests=1.0)
    sched = Scheduler(make_spec(make_lane(max_concurrency=4), tenants=[tenant]))
    assert ids(sched.submit(make_ticket("a"), 0.0), Admit) == ["a"]
    reject = the_reject(sched.submit(make_ticket("b"), 1.0))
    assert (reject.status, reject.code) == (429, ErrorCode.RATE_LIMIT_EXCEEDED)
    assert reject.retry_after_s == pytest.approx(3.0)
    assert ids(sched.submit(make_ticket("c"), 4.0), Admit) == ["c"]


def test_token_rate_limit_rejects_with_retry_after(
    make_spec: SpecFactory, make_lane: LaneFactory, make_ticket: TicketFactory
) -> None:
    """tokens_per_min charges prompt + max_tokens up front; retry-after = deficit / rate."""
    tenant = TenantSpec(name="t", tokens_per_min=600.0)  # 10 tokens/s, burst 600
    sched = Scheduler(make_spec(make_lane(max_concurrency=4), tenants=[tenant]))
    sched.submit(make_ticket("a", prompt_tokens=100, max_tokens=400), 0.0)  # leaves 100
    reject = the_reject(sched.submit(make_ticket("b", prompt_tokens=100, max_tokens=200), 0.0))
    assert reject.code is ErrorCode.RATE_LIMIT_EXCEEDED
    assert reject.retry_after_s == pytest.approx((300 - 100) / 10.0)


def test_completion_refunds_unused_tokens(
    make_spec: SpecFactory, make_lane: LaneFactory, make_ticket: TicketFactory
) -> None:
    """On completion, the tokens charged but not used (max_tokens − real output) are refunded."""
    tenant = TenantSpec(name="t", tokens_per_min=60.0, burst_tokens=1000.0)  # 1 token/s
    sched = Scheduler(make_spec(make_lane(max_concurrency=4), tenants=[tenant]))
    sched.submit(make_ticket("a", prompt_tokens=100, max_tokens=800), 0.0)  # leaves 100
    follow = make_ticket("b", prompt_tokens=100, max_tokens=700)
    assert only(sched.submit(follow, 0.0), Reject)
    sched.complete(TicketId("a"), Usage(prompt_tokens=100, completion_tokens=50), 0.0)
    assert ids(sched.submit(follow, 0.0), Admit) == ["b"]


# ---------------------------------------------------------------------------- shedding


def test_shed_hopeless_rejects_unmeetable_deadline(
    make_spec: SpecFactory, make_lane: LaneFactory, make_ticket: TicketFactory
) -> None:
    """shed_hopeless: a ticket whose predicted service ends after its deadline → 503 overloaded."""
    sched = Scheduler(make_spec(make_lane(shed_hopeless=True)))
    # 400 tokens at the 40 tok/s prior = 10 s of service, deadline in 5 s.
    ticket = make_ticket("a", predicted=400, max_tokens=400, deadline=5.0)
    reject = the_reject(sched.submit(ticket, 0.0))
    assert (reject.status, reject.code) == (503, ErrorCode.OVERLOADED)
    assert 0.001 <= reject.retry_after_s < math.inf
    assert sched.live_tickets() == 0


def test_shed_hopeless_admits_meetable_deadline(
    make_spec: SpecFactory, make_lane: LaneFactory, make_ticket: TicketFactory
) -> None:
    """shed_hopeless keeps a ticket whose predicted service fits before its deadline."""
    sched = Scheduler(make_spec(make_lane(shed_hopeless=True)))
    ticket = make_ticket("a", predicted=400, max_tokens=400, deadline=20.0)
    assert ids(sched.submit(ticket, 0.0), Admit) == ["a"]


def test_shed_hopeless_counts_wait_behind_busy_lane(
    make_spec: SpecFactory, make_lane: LaneFactory, make_ticket: TicketFactory
) -> None:
    """shed_hopeless: when the lane is at its cap, the ticket must wait for a slot, so a
    deadline that only the service time alone would meet is still unmeetable → 503."""
    sched = Scheduler(make_spec(make_lane(shed_hopeless=True), max_concurrency=8))
    sched.submit(make_ticket("long", predicted=4000, max_tokens=4000, deadline=1000.0), 0.0)
    # 40 tokens = 1 s of service, deadline in 2 s: only possible if it could start now.
    reject = the_reject(sched.submit(make_ticket("a", predicted=40, deadline=2.0), 0.0))
    assert reject.code is ErrorCode.OVERLOADED


# ---------------------------------------------------------------------------- caps


def test_lane_cap_holds(
    make_spec: SpecFactory, make_lane: LaneFactory, make_ticket: TicketFactory
) -> None:
    """A lane that may not borrow never runs more than its max_concurrency."""
    lanes = (make_lane("a", max_concurrency=2, borrow=False), make_lane("b", max_concurrency=2))
    sched = Scheduler(make_spec(*lanes))
    admitted = [ids(sched.submit(make_ticket(f"a{i}", lane="a"), 0.0), Admit) for i in range(5)]
    assert sum(len(a) for a in admitted) == 2
    view = sched.lane_view(MODEL, "a")
    assert (view.running, view.queued) == (2, 3)


def test_model_cap_holds_across_lanes(
    make_spec: SpecFactory, make_lane: LaneFactory, make_ticket: TicketFactory
) -> None:
    """The model never runs more than its max_concurrency, summed over lanes."""
    lanes = (make_lane("a", max_concurrency=2), make_lane("b", max_concurrency=2))
    sched = Scheduler(make_spec(*lanes, max_concurrency=3))
    for i in range(3):
        sched.submit(make_ticket(f"a{i}", lane="a"), 0.0)
        sched.submit(make_ticket(f"b{i}", lane="b"), 0.0)
    view = sched.view(MODEL)
    assert view.running == 3
    assert view.queued == 3


def test_inflight_token_budget_blocks_head_that_does_not_fit(
    make_spec: SpecFactory, make_lane: LaneFactory, make_ticket: TicketFactory
) -> None:
    """max_inflight_tokens: a head whose prompt + predicted output overflows the budget waits
    (despite free slots) until enough running work finishes."""
    spec = make_spec(make_lane(max_concurrency=8), max_inflight_tokens=1000)
    sched = Scheduler(spec)
    assert ids(sched.submit(make_ticket("a", prompt_tokens=300, predicted=300), 0.0), Admit)
    assert only(sched.submit(make_ticket("b", prompt_tokens=300, predicted=300), 0.0), Queued)
    assert sched.view(MODEL).inflight_tokens == 600
    assert ids(sched.complete(TicketId("a"), OK, 1.0), Admit) == ["b"]


def test_inflight_token_budget_lets_huge_request_run_alone(
    make_spec: SpecFactory, make_lane: LaneFactory, make_ticket: TicketFactory
) -> None:
    """max_inflight_tokens: a request bigger than the whole budget runs when nothing else does."""
    sched = Scheduler(make_spec(make_lane(max_concurrency=8), max_inflight_tokens=1000))
    huge = make_ticket("huge", prompt_tokens=4000, predicted=2000, max_tokens=2000)
    assert ids(sched.submit(huge, 0.0), Admit) == ["huge"]


# ---------------------------------------------------------------------------- borrowing


def two_lanes(
    make_spec: SpecFactory,
    make_lane: LaneFactory,
    *,
    borrow: bool = True,
    lend: bool = True,
    model_cap: int = 64,
) -> Scheduler:
    """Lane ``a`` (cap 1, preemptible always) and lane ``b`` (cap 1) sharing model ``m``."""
    lane_a = make_lane("a", borrow=borrow, preemptible="always")
    lane_b = make_lane("b", lend=lend)
    return Scheduler(make_spec(lane_a, lane_b, max_concurrency=model_cap))


@pytest.mark.parametrize(
    ("borrow", "lend", "borrowed"),
    [
        pytest.param(True, True, 1, id="borrows-idle-quota"),
        pytest.param(False, True, 0, id="borrow-false-queues"),
        pytest.param(True, False, 0, id="lend-false-reserves"),
    ],
)
def test_full_lane_borrows_only_idle_quota_that_may_be_lent(
    borrow: bool,
    lend: bool,
    borrowed: int,
    make_spec: SpecFactory,
    make_lane: LaneFactory,
    make_ticket: TicketFactory,
) -> None:
    """borrow: true — a full lane runs extra tickets on another lane's idle quota;
    borrow: false — it queues even though the other lane is idle; lend: false — a lane's
    idle quota is never lent to a borrowing lane, and its own ticket still runs there."""
    sched = two_lanes(make_spec, make_lane, borrow=borrow, lend=lend)
    sched.submit(make_ticket("a1", lane="a"), 0.0)
    assert ids(sched.submit(make_ticket("a2", lane="a"), 0.0), Admit if borrowed else Queued)
    view = sched.lane_view(MODEL, "a")
    assert (view.own, view.borrowed, view.queued) == (1, borrowed, 1 - borrowed)
    if not lend:
        assert ids(sched.submit(make_ticket("b1", lane="b"), 0.0), Admit) == ["b1"]


def test_lender_reclaims_by_preempting_borrower(
    make_spec: SpecFactory, make_lane: LaneFactory, make_ticket: TicketFactory
) -> None:
    """When the lender's own ticket arrives and the model is at cap, the borrower is preempted;
    the slot frees only once the driver completes the victim, then the lender's ticket runs."""
    sched = two_lanes(make_spec, make_lane, model_cap=2)
    sched.submit(make_ticket("a1", lane="a"), 0.0)
    sched.submit(make_ticket("a2", lane="a"), 0.0)
    out = sched.submit(make_ticket("b1", lane="b"), 1.0)
    assert ids(out, Queued) == ["b1"]
    (preempt,) = only(out, Preempt)
    assert preempt.ticket.id == "a2"
    assert sched.state_of(TicketId("b1")) is State.QUEUED
    assert ids(sched.tick(2.0), Admit) == []
    assert ids(sched.complete(TicketId("a2"), OK, 3.0), Admit) == ["b1"]
    assert sched.state_of(TicketId("a2")) is None
    assert sched.lane_view(MODEL, "a").borrowed == 0


# ---------------------------------------------------------------------------- preemption


def preemption_lane(
    make_spec: SpecFactory, make_lane: LaneFactory, cap: int = 1, **lane: object
) -> Scheduler:
    """One lane preemptible by priority tier, ``cap`` slots, model cap equal to it."""
    spec = make_spec(
        make_lane(max_concurrency=cap, preemptible="priority", **lane), max_concurrency=cap
    )
    return Scheduler(spec)


def urgent(make_ticket: TicketFactory, name: str, now: float, priority: int = 0) -> Ticket:
    """A ticket whose deadline is already closer than its predicted service: urgent at once."""
    return make_ticket(name, priority=priority, arrival=now, deadline=now + 0.5, predicted=40)


def victim(make_ticket: TicketFactory, name: str, priority: int, **fields: object) -> Ticket:
    """A streaming ticket with max_tokens 100, whose progress the test reports."""
    return make_ticket(name, priority=priority, max_tokens=100, streaming=True, **fields)


def preempted_for_w(sched: Scheduler, make_ticket: TicketFactory) -> list[Preempt]:
    """The preemptions issued when the urgent priority-0 waiter ``w`` arrives at t=1."""
    return only(sched.submit(urgent(make_ticket, "w", 1.0), 1.0), Preempt)


def aborted_and_gone(sched: Scheduler, preempt: Preempt, now: float) -> None:
    """``preempt`` aborts ``v``, which is gone once the driver completes it at ``now``."""
    assert preempt.action is PreemptAction.ABORT
    sched.complete(TicketId("v"), OK, now)
    assert sched.state_of(TicketId("v")) is None


@pytest.mark.parametrize(
    ("priority", "generated"),
    [
        pytest.param(1, 0, id="1"),
        pytest.param(2, 0, id="2"),
        pytest.param(3, 0, id="3"),
        pytest.param(1, 99, id="1-even-when-done"),
    ],
)
def test_priorities_up_to_three_not_preempted_without_progress(
    priority: int,
    generated: int,
    make_spec: SpecFactory,
    make_lane: LaneFactory,
    make_ticket: TicketFactory,
) -> None:
    """Priorities 0–1 are never preempted, whatever their progress, and 2–3 not before 80%
    progress, even for an urgent priority-0 waiter."""
    sched = preemption_lane(make_spec, make_lane)
    sched.submit(victim(make_ticket, "v", priority), 0.0)
    if generated:
        sched.progress(TicketId("v"), generated)
    assert preempted_for_w(sched, make_ticket) == []
    for now in (5.0, 50.0):
        assert only(sched.tick(now), Preempt) == []


def test_priority_three_preempted_after_eighty_percent(
    make_spec: SpecFactory, make_lane: LaneFactory, make_ticket: TicketFactory
) -> None:
    """Priority 2–3 becomes preemptible once 80% of max_tokens has been generated."""
    sched = preemption_lane(make_spec, make_lane)
    sched.submit(victim(make_ticket, "v", 3), 0.0)
    sched.progress(TicketId("v"), 79)
    assert preempted_for_w(sched, make_ticket) == []
    wakeup = sched.next_wakeup()
    assert wakeup is not None
    assert only(sched.tick(wakeup), Preempt) == []
    sched.progress(TicketId("v"), 80)
    wakeup = sched.next_wakeup()
    assert wakeup is not None
    assert ids(sched.tick(wakeup), Preempt) == ["v"]


@pytest.mark.parametrize("priority", [4, 5])
def test_low_priorities_preempted_any_time(
    priority: int, make_spec: SpecFactory, make_lane: LaneFactory, make_ticket: TicketFactory
) -> None:
    """Priority 4–5 is preempted with no progress at all, for an urgent more important waiter."""
    sched = preemption_lane(make_spec, make_lane)
    sched.submit(victim(make_ticket, "v", priority), 0.0)
    (preempt,) = preempted_for_w(sched, make_ticket)
    assert (preempt.ticket.id, preempt.action) == ("v", PreemptAction.ABORT)
    assert ids(sched.complete(TicketId("v"), OK, 2.0), Admit) == ["w"]


@pytest.mark.parametrize(
    ("running", "chosen"),
    [
        pytest.param({"p4": (4, 5), "p5": (5, 90)}, "p5", id="lowest-priority-first"),
        pytest.param({"x": (4, 50), "y": (4, 10)}, "y", id="least-progress-among-equals"),
    ],
)
def test_victim_choice(
    running: dict[str, tuple[int, int]],
    chosen: str,
    make_spec: SpecFactory,
    make_lane: LaneFactory,
    make_ticket: TicketFactory,
) -> None:
    """Victim choice: the least important running ticket, even if it has more progress;
    among equal priorities, the one with the least progress to lose. ``running``: name →
    (priority, tokens generated)."""
    sched = preemption_lane(make_spec, make_lane, cap=2)
    for name, (priority, _) in running.items():
        sched.submit(victim(make_ticket, name, priority), 0.0)
    for name, (_, generated) in running.items():
        sched.progress(TicketId(name), generated)
    assert [p.ticket.id for p in preempted_for_w(sched, make_ticket)] == [chosen]


def test_requeue_puts_non_streaming_victim_back(
    make_spec: SpecFactory, make_lane: LaneFactory, make_ticket: TicketFactory
) -> None:
    """preempt_action requeue: a non-streaming victim is queued again after its complete."""
    sched = preemption_lane(make_spec, make_lane, preempt_action="requeue", policy="priority")
    sched.submit(make_ticket("v", priority=4), 0.0)
    (preempt,) = preempted_for_w(sched, make_ticket)
    assert preempt.action is PreemptAction.REQUEUE
    assert ids(sched.complete(TicketId("v"), OK, 2.0), Admit) == ["w"]
    assert sched.state_of(TicketId("v")) is State.QUEUED


def test_requeued_victim_does_not_take_the_slot_freed_for_waiter(
    make_spec: SpecFactory, make_lane: LaneFactory, make_ticket: TicketFactory
) -> None:
    """The slot a preemption frees goes to the waiter it was issued for, even when the
    requeued victim would sort ahead of it in the lane (fifo: the victim arrived first)."""
    sched = preemption_lane(make_spec, make_lane, preempt_action="requeue", policy="fifo")
    sched.submit(make_ticket("v", priority=4), 0.0)
    assert [p.ticket.id for p in preempted_for_w(sched, make_ticket)] == ["v"]
    out = sched.complete(TicketId("v"), OK, 2.0)
    assert ids(out, Admit) == ["w"]
    assert only(out, Preempt) == []
    assert sched.state_of(TicketId("v")) is State.QUEUED


def test_requeue_is_capped_by_max_requeues(
    make_spec: SpecFactory, make_lane: LaneFactory, make_ticket: TicketFactory
) -> None:
    """After max_requeues re-runs, the next preemption of the same ticket aborts it."""
    sched = preemption_lane(
        make_spec, make_lane, preempt_action="requeue", max_requeues=1, policy="priority"
    )
    sched.submit(make_ticket("v", priority=4), 0.0)
    sched.submit(urgent(make_ticket, "w1", 1.0), 1.0)
    sched.complete(TicketId("v"), OK, 2.0)
    assert ids(sched.complete(TicketId("w1"), OK, 3.0), Admit) == ["v"]
    (preempt,) = only(sched.submit(urgent(make_ticket, "w2", 4.0), 4.0), Preempt)
    aborted_and_gone(sched, preempt, 5.0)


def test_streaming_victim_is_never_requeued(
    make_spec: SpecFactory, make_lane: LaneFactory, make_ticket: TicketFactory
) -> None:
    """A streaming ticket can't be re-run transparently: requeue lanes abort it instead."""
    sched = preemption_lane(make_spec, make_lane, preempt_action="requeue")
    sched.submit(victim(make_ticket, "v", 4), 0.0)
    (preempt,) = preempted_for_w(sched, make_ticket)
    aborted_and_gone(sched, preempt, 2.0)


# ---------------------------------------------------------------------------- cancel, drain


def behind_run(
    make_spec: SpecFactory, make_lane: LaneFactory, make_ticket: TicketFactory, *waiting: str
) -> Scheduler:
    """The default one-slot lane running ``run`` at t=0, with ``waiting`` queued behind it."""
    sched = Scheduler(make_spec(make_lane()))
    for name in ("run", *waiting):
        sched.submit(make_ticket(name), 0.0)
    return sched


def test_cancel_queued_ticket_removes_it(
    make_spec: SpecFactory, make_lane: LaneFactory, make_ticket: TicketFactory
) -> None:
    """Cancelling a queued ticket takes it out of the queue; it is never admitted later."""
    sched = behind_run(make_spec, make_lane, make_ticket, "gone", "next")
    assert sched.cancel(TicketId("gone"), 1.0) == []
    assert sched.state_of(TicketId("gone")) is None
    assert sched.lane_view(MODEL, LANE).queued == 1
    assert ids(sched.complete(TicketId("run"), OK, 2.0), Admit) == ["next"]


def test_cancel_running_ticket_frees_slot(
    make_spec: SpecFactory, make_lane: LaneFactory, make_ticket: TicketFactory
) -> None:
    """Cancelling a running ticket frees its slot and admits the next waiter."""
    sched = behind_run(make_spec, make_lane, make_ticket, "next")
    assert ids(sched.cancel(TicketId("run"), 1.0), Admit) == ["next"]
    assert sched.view(MODEL).running == 1


def test_unknown_ids_are_no_ops(
    make_spec: SpecFactory, make_lane: LaneFactory, make_ticket: TicketFactory
) -> None:
    """complete/cancel of an unknown (or already ended) id return nothing and change nothing."""
    sched = behind_run(make_spec, make_lane, make_ticket, "wait")
    sched.cancel(TicketId("wait"), 0.5)
    before = sched.view(MODEL)
    assert sched.complete(TicketId("nope"), OK, 1.0) == []
    assert sched.cancel(TicketId("nope"), 1.0) == []
    assert sched.complete(TicketId("wait"), OK, 1.0) == []
    assert sched.cancel(TicketId("wait"), 1.0) == []
    assert sched.view(MODEL) == before
    assert sched.live_tickets() == 1


def test_drain_rejects_new_but_runs_queued(
    make_spec: SpecFactory, make_lane: LaneFactory, make_ticket: TicketFactory
) -> None:
    """drain(): new submits get 503 draining; already queued work is still admitted."""
    sched = behind_run(make_spec, make_lane, make_ticket, "queued")
    sched.drain()
    reject = the_reject(sched.submit(make_ticket("new"), 1.0))
    assert (reject.status, reject.code) == (503, ErrorCode.DRAINING)
    assert ids(sched.complete(TicketId("run"), OK, 2.0), Admit) == ["queued"]


def test_undrain_admits_new_tickets_again(
    make_spec: SpecFactory, make_lane: LaneFactory, make_ticket: TicketFactory
) -> None:
    """undrain() after drain(): a new submit is admitted again, as before the drain."""
    sched = Scheduler(make_spec(make_lane()))
    sched.drain()
    the_reject(sched.submit(make_ticket("refused"), 0.0))
    sched.undrain()
    assert not sched.draining
    assert ids(sched.submit(make_ticket("new"), 1.0), Admit) == ["new"]


# ---------------------------------------------------------------------------- health


def all_down(sched: Scheduler, now: float) -> None:
    """An active probe finds both backends down."""
    for backend in ("b0", "b1"):
        sched.observe_backend(BackendStats(MODEL, backend, healthy=False), now)


def test_no_healthy_backend_rejects_with_503(
    make_spec: SpecFactory, make_lane: LaneFactory, make_ticket: TicketFactory
) -> None:
    """With every backend probed unhealthy, submits get 503 no_healthy_backend."""
    sched = Scheduler(make_spec(make_lane(), backends=("b0", "b1")))
    all_down(sched, 0.0)
    reject = the_reject(sched.submit(make_ticket("a"), 1.0))
    assert (reject.status, reject.code) == (503, ErrorCode.NO_HEALTHY_BACKEND)
    assert 0.001 <= reject.retry_after_s < math.inf


@pytest.mark.parametrize(
    ("model", "submit_at"),
    [
        pytest.param({}, 1.0, id="at-once"),
        pytest.param({"circuit_cooldown_s": 10.0}, 10.0, id="after-cooldown"),
    ],
)
def test_backend_probed_healthy_again_takes_traffic(
    model: dict[str, float],
    submit_at: float,
    make_spec: SpecFactory,
    make_lane: LaneFactory,
    make_ticket: TicketFactory,
) -> None:
    """After a probe reports a backend healthy again, new tickets are admitted onto it: at
    once by default, and at the latest once a cool-down of its circuit ends."""
    sched = Scheduler(make_spec(make_lane(), backends=("b0", "b1"), **model))
    all_down(sched, 0.0)
    sched.observe_backend(BackendStats(MODEL, "b1", healthy=True), 1.0)
    (admit,) = only(sched.submit(make_ticket("a"), submit_at), Admit)
    assert admit.backend == "b1"


def test_passive_circuit_routes_around_failing_backend(
    make_spec: SpecFactory, make_lane: LaneFactory, make_ticket: TicketFactory
) -> None:
    """circuit_failures consecutive failed completions on a backend open its circuit:
    new tickets go to the other backend only."""
    spec = make_spec(make_lane(max_concurrency=8), backends=("b0", "b1"), circuit_failures=3)
    sched = Scheduler(spec)
    failures = 0
    now = 0.0
    while failures < 3 and now < 20.0:
        now += 1.0
        (admit,) = only(sched.submit(make_ticket(f"x{now}"), now), Admit)
        bad = admit.backend == "b0"
        failures += bad
        sched.complete(admit.ticket.id, Usage(100, 10, ok=not bad), now)
    assert failures == 3
    placed = [only(sched.submit(make_ticket(f"y{i}"), now), Admit)[0].backend for i in range(4)]
    assert placed == ["b1"] * 4
    assert {b.name: b.circuit for b in sched.view(MODEL).backends}["b0"] == "open"


def test_open_circuit_reads_healthy_after_cooldown_with_no_traffic(
    make_spec: SpecFactory, make_lane: LaneFactory, make_ticket: TicketFactory
) -> None:
    """Health is judged at the view's time: a tripped backend that receives nothing reads
    unhealthy (circuit open) during its cool-down and healthy (half-open) once it ends,
    without any dispatch having to move the circuit first."""
    spec = make_spec(
        make_lane(max_concurrency=8), backends=("b0",), circuit_failures=1, circuit_cooldown_s=5.0
    )
    sched = Scheduler(spec)
    (admit,) = only(sched.submit(make_ticket("a"), 0.0), Admit)
    sched.complete(admit.ticket.id, Usage(100, 10, ok=False), 1.0)
    (during,) = sched.view(MODEL, 5.9).backends
    assert (during.healthy, during.circuit) == (False, "open")
    (after,) = sched.view(MODEL, 6.0).backends
    assert (after.healthy, after.probe_healthy, after.circuit) == (True, True, "half_open")


# ---------------------------------------------------------------------------- adaptive


def test_kv_cache_pressure_lowers_cap_and_queues(
    make_spec: SpecFactory, make_lane: LaneFactory, make_ticket: TicketFactory
) -> None:
    """adaptive kv_cache: usage above high water lowers the effective cap (ModelView.cap),
    and new tickets queue instead of running."""
    spec = make_spec(
        make_lane(max_concurrency=4), max_concurrency=4, adaptive=AdaptiveSpec(mode="kv_cache")
    )
    sched = Scheduler(spec)
    sched.submit(make_ticket("a"), 0.0)
    sched.submit(make_ticket("b"), 0.0)
    for now in (1.0, 2.0):
        sched.observe_backend(BackendStats(MODEL, "b0", kv_cache_usage=0.95), now)
    view = sched.view(MODEL)
    assert view.cap == 2 < view.configured_cap
    assert ids(sched.submit(make_ticket("c"), 3.0), Queued) == ["c"]
    assert sched.view(MODEL).running == 2
