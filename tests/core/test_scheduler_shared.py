"""Distributed mode in the core, one rule per test: ``use_store``, ``Reserve`` (urgency and
preemptibility for the store), ``grant``, ``stop`` and ``lose_store`` (fail open at a share
of the limits, or closed)."""

from __future__ import annotations

import pytest

from sluicegate.core.component_specs import BackendSpec
from sluicegate.core.decisions import (
    Admit,
    ErrorCode,
    Expire,
    Preempt,
    PreemptAction,
    Queued,
    Reject,
    Reserve,
)
from sluicegate.core.entry import State
from sluicegate.core.ratelimit import TenantRateLimiter
from sluicegate.core.scheduler import Scheduler
from sluicegate.core.spec import TenantSpec
from sluicegate.core.ticket import TicketId, Usage
from tests.core.conftest import LANE, MODEL, LaneFactory, SpecFactory, TicketFactory


def shared(make_spec: SpecFactory, make_lane: LaneFactory, **lane: object) -> Scheduler:
    """A scheduler in distributed mode whose one lane has cap 4."""
    sched = Scheduler(make_spec(make_lane(max_concurrency=4, **lane), max_concurrency=4))
    assert sched.use_store(0.0) == []
    return sched


def test_submit_offers_instead_of_admitting(
    make_spec: SpecFactory, make_lane: LaneFactory, make_ticket: TicketFactory
) -> None:
    """With free capacity, a ticket still queues and is offered: ``Queued`` then ``Reserve``
    with the lane ordering's key, its token cost and its VTC charge (prompt + 2 × predicted)."""
    sched = shared(make_spec, make_lane, policy="priority")
    ticket = make_ticket("a", priority=3, arrival=7.0, prompt_tokens=50, predicted=20)
    queued, reserve = sched.submit(ticket, 7.0)
    assert queued == Queued(ticket, None)
    assert isinstance(reserve, Reserve)
    assert reserve[:4] == (ticket, (3, 7.0), 70, 50 + 2 * 20)
    assert sched.state_of(ticket.id) is State.QUEUED


def test_reserve_says_when_a_ticket_turns_urgent(
    make_spec: SpecFactory, make_lane: LaneFactory, make_ticket: TicketFactory
) -> None:
    """``urgent_at`` is when the store may preempt for the ticket: ``preempt_after_ms`` after
    it queued, or its latest start (deadline less its predicted service) if sooner; none in
    a model whose lanes are all ``preemptible: never``."""
    sched = shared(make_spec, make_lane, preempt_after_ms=200, preemptible="always")
    far = make_ticket("far", arrival=7.0, deadline=1000.0)
    _, reserve = sched.submit(far, 7.0)
    assert isinstance(reserve, Reserve)
    assert reserve.urgent_at == 7.2
    unpreemptible = shared(make_spec, make_lane, preempt_after_ms=200, preemptible="never")
    _, never = unpreemptible.submit(make_ticket("far", arrival=7.0, deadline=1000.0), 7.0)
    assert isinstance(never, Reserve)
    assert never.urgent_at is None  # no lane has a victim: nothing to turn urgent for
    near = make_ticket("near", arrival=7.0, deadline=7.1)
    _, soon = sched.submit(near, 7.0)
    assert isinstance(soon, Reserve)
    assert soon.urgent_at is not None
    assert soon.urgent_at < 7.1


def test_reserve_says_when_a_ticket_may_be_preempted(
    make_spec: SpecFactory, make_lane: LaneFactory, make_ticket: TicketFactory
) -> None:
    """``preempt_delay_s`` follows the lane's rule: ``always`` at once, ``never`` not at all,
    priority tiers 0–1 never, 4–5 at once, 2–3 after 80% of ``max_tokens`` when streamed
    (a non-streamed one in an ``abort`` lane finishes: never)."""
    for rule, priority, expected in (("always", 0, 0.0), ("never", 5, None), ("priority", 1, None)):
        sched = shared(make_spec, make_lane, preemptible=rule)
        _, reserve = sched.submit(make_ticket("a", priority=priority), 0.0)
        assert isinstance(reserve, Reserve)
        assert reserve.preempt_delay_s == expected, rule
    sched = shared(make_spec, make_lane, preemptible="priority")
    _, top = sched.submit(make_ticket("low", priority=4), 0.0)
    _, middle = sched.submit(make_ticket("mid", priority=3, max_tokens=100, streaming=True), 0.0)
    _, unary = sched.submit(make_ticket("unary", priority=3, max_tokens=100), 0.0)
    assert isinstance(top, Reserve)
    assert isinstance(middle, Reserve)
    assert isinstance(unary, Reserve)
    assert top.preempt_delay_s == 0.0
    assert unary.preempt_delay_s is None
    # Prior rates (8,000 prompt tokens/s, 40 output tokens/s): 100 prompt tokens take
    # 12.5 ms, then 80 of its 100 output tokens 2 s.
    assert middle.preempt_delay_s == pytest.approx(0.0125 + 80 / 40.0)


def test_reserve_says_when_a_tenant_may_take_a_slot_back(
    make_spec: SpecFactory, make_lane: LaneFactory, make_ticket: TicketFactory
) -> None:
    """``share_from``: in a ``vtc`` lane that gives shares back, ``preempt_after_ms`` after
    the ticket queued (at once without it); ``None`` in a lane without fairness, and in a
    fair lane whose tickets are never preempted."""
    fair = shared(make_spec, make_lane, fairness="vtc", preemptible="always", preempt_after_ms=200)
    _, graced = fair.submit(make_ticket("a", arrival=3.0), 3.0)
    assert isinstance(graced, Reserve)
    assert graced.share_from == 3.2
    at_once = shared(make_spec, make_lane, fairness="vtc", preemptible="always")
    _, now = at_once.submit(make_ticket("b", arrival=3.0), 3.0)
    assert isinstance(now, Reserve)
    assert now.share_from == 3.0
    for lane in ({"preemptible": "always"}, {"fairness": "vtc", "preemptible": "never"}):
        _, none = shared(make_spec, make_lane, **lane).submit(make_ticket("c"), 0.0)
        assert isinstance(none, Reserve)
        assert none.share_from is None, lane


def test_stop_preempts_a_running_ticket_once(
    make_spec: SpecFactory, make_lane: LaneFactory, make_ticket: TicketFactory
) -> None:
    """The store's stop preempts a running ticket by its lane's action (requeue here), once;
    a queued or unknown ticket gets nothing. Its completion queues and offers it again."""
    sched = shared(make_spec, make_lane, preempt_action="requeue")
    sched.submit(make_ticket("a"), 0.0)
    sched.submit(make_ticket("b"), 0.0)
    sched.grant(TicketId("a"), 0.1)
    (preempt,) = sched.stop(TicketId("a"))
    assert isinstance(preempt, Preempt)
    assert preempt.action is PreemptAction.REQUEUE
    assert sched.stop(TicketId("a")) == []
    assert sched.stop(TicketId("b")) == []
    assert sched.stop(TicketId("nobody")) == []
    again = sched.complete(TicketId("a"), Usage(100, 3), 0.5)
    assert [type(d) for d in again] == [Reserve]
    assert sched.state_of(TicketId("a")) is State.QUEUED


def test_grant_admits_a_queued_ticket(
    make_spec: SpecFactory, make_lane: LaneFactory, make_ticket: TicketFactory
) -> None:
    """``grant`` takes the ticket out of its queue and admits it, waited time included."""
    sched = shared(make_spec, make_lane)
    sched.submit(make_ticket("a", arrival=1.0), 1.0)
    (admit,) = sched.grant(TicketId("a"), 1.5)
    assert admit == Admit(admit.ticket, "b0", 0.5)
    assert sched.state_of(TicketId("a")) is State.RUNNING
    assert sched.view(MODEL).lanes[0].queued == 0
    assert sched.complete(TicketId("a"), Usage(100, 10), 2.0) == []
    assert sched.live_tickets() == 0


def test_grant_of_an_ended_or_running_ticket_gives_nothing(
    make_spec: SpecFactory, make_lane: LaneFactory, make_ticket: TicketFactory
) -> None:
    """A grant for a ticket that left (or already runs) yields nothing: the driver gives the
    slot back."""
    sched = shared(make_spec, make_lane)
    sched.submit(make_ticket("a"), 0.0)
    sched.cancel(TicketId("a"), 0.1)
    assert sched.grant(TicketId("a"), 0.2) == []
    sched.submit(make_ticket("b"), 0.0)
    assert len(sched.grant(TicketId("b"), 0.3)) == 1
    assert sched.grant(TicketId("b"), 0.4) == []


def test_grant_with_no_backend_free_offers_again(
    make_spec: SpecFactory, make_lane: LaneFactory, make_ticket: TicketFactory
) -> None:
    """When every backend is at its own cap, a granted ticket stays queued and is offered
    again."""
    spec = make_spec(make_lane(max_concurrency=4), max_concurrency=4)
    spec = spec.model_copy(
        update={
            "models": (
                spec.models[0].model_copy(
                    update={"backends": (BackendSpec(name="b0", max_concurrency=1),)}
                ),
            )
        }
    )
    sched = Scheduler(spec)
    sched.use_store(0.0)
    sched.submit(make_ticket("a"), 0.0)
    sched.submit(make_ticket("b"), 0.0)
    assert isinstance(sched.grant(TicketId("a"), 0.1)[0], Admit)
    (again,) = sched.grant(TicketId("b"), 0.1)
    assert isinstance(again, Reserve)
    assert again.ticket.id == "b"
    assert sched.state_of(TicketId("b")) is State.QUEUED


def test_use_store_offers_what_waits(
    make_spec: SpecFactory, make_lane: LaneFactory, make_ticket: TicketFactory
) -> None:
    """Tickets queued in local mode are offered, in submission order, on ``use_store``."""
    sched = Scheduler(make_spec(make_lane(max_concurrency=1)))
    for name in ("a", "b", "c"):
        sched.submit(make_ticket(name), 0.0)
    offers = sched.use_store(1.0)
    assert [(type(d), d.ticket.id) for d in offers] == [(Reserve, "b"), (Reserve, "c")]


def test_queue_timeout_still_expires_in_shared_mode(
    make_spec: SpecFactory, make_lane: LaneFactory, make_ticket: TicketFactory
) -> None:
    """Waiting for the store, a ticket still leaves at its queue timeout."""
    sched = shared(make_spec, make_lane, queue_timeout_s=2.0)
    sched.submit(make_ticket("a"), 0.0)
    assert sched.next_wakeup() == 2.0
    (expire,) = sched.tick(2.0)
    assert isinstance(expire, Expire)
    assert expire.code is ErrorCode.QUEUE_TIMEOUT
    assert sched.grant(TicketId("a"), 2.1) == []


def test_rate_limits_are_left_to_the_store(
    make_spec: SpecFactory, make_lane: LaneFactory, make_ticket: TicketFactory
) -> None:
    """In shared mode the local limiter is neither charged nor refunded (the driver charged
    the store); after a fail-open fallback the given local limiter applies."""
    tenants = (TenantSpec(name="t", requests_per_s=1.0),)
    sched = Scheduler(make_spec(make_lane(max_concurrency=4), tenants=tenants, max_concurrency=4))
    sched.use_store(0.0)
    for name in ("a", "b", "c"):
        assert isinstance(sched.submit(make_ticket(name), 0.0)[0], Queued)
    sched.lose_store(0.0, fail_open=True, share=0.5, rate_limiter=TenantRateLimiter(tenants))
    assert isinstance(sched.submit(make_ticket("d"), 0.0)[0], Admit | Queued)
    (reject,) = sched.submit(make_ticket("e"), 0.0)
    assert isinstance(reject, Reject)
    assert reject.code is ErrorCode.RATE_LIMIT_EXCEEDED


def test_fail_open_admits_locally_at_the_share(
    make_spec: SpecFactory, make_lane: LaneFactory, make_ticket: TicketFactory
) -> None:
    """fail_open at share 1/2: caps halve (4 → 2) and queued tickets run up to them; back in
    shared mode the caps are whole again and what still waits is offered."""
    sched = shared(make_spec, make_lane)
    for name in "abc":
        sched.submit(make_ticket(name), 0.0)
    decisions = sched.lose_store(1.0, fail_open=True, share=0.5)
    assert [d.ticket.id for d in decisions if isinstance(d, Admit)] == ["a", "b"]
    assert sched.view(MODEL).cap == 2
    (offer,) = sched.use_store(2.0)
    assert isinstance(offer, Reserve)
    assert offer.ticket.id == "c"
    assert sched.view(MODEL).cap == 4


def test_fail_closed_expires_the_waiting_and_refuses_new(
    make_spec: SpecFactory, make_lane: LaneFactory, make_ticket: TicketFactory
) -> None:
    """fail_closed: queued tickets end with 503 ``store_unavailable``, new ones are refused
    the same way, running ones go on; ``use_store`` opens again."""
    sched = shared(make_spec, make_lane)
    sched.submit(make_ticket("run"), 0.0)
    sched.grant(TicketId("run"), 0.0)
    sched.submit(make_ticket("wait"), 0.0)
    (expire,) = sched.lose_store(1.0, fail_open=False, share=0.5)
    assert isinstance(expire, Expire)
    assert (expire.ticket.id, expire.code) == ("wait", ErrorCode.STORE_UNAVAILABLE)
    (reject,) = sched.submit(make_ticket("new"), 1.0)
    assert isinstance(reject, Reject)
    assert (reject.status, reject.code, reject.retry_after_s) == (
        503,
        ErrorCode.STORE_UNAVAILABLE,
        1.0,
    )
    assert sched.state_of(TicketId("run")) is State.RUNNING
    sched.use_store(2.0)
    assert [type(d) for d in sched.submit(make_ticket("later"), 2.0)] == [Queued, Reserve]
    assert sched.view(MODEL).lanes[0].name == LANE
