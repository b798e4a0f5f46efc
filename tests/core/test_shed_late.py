"""Shedding after queueing, and a preemption that races with the answer's end.

In a lane with ``shed_hopeless`` a queued ticket leaves when its latest start
(deadline − predicted service) passes, not only at its queue timeout: later
arrivals with tighter deadlines may overtake it, and running it then would be
late work that takes a slot. And a ``Preempt`` for a ticket whose answer ended
at the same instant stops nothing: ``complete(..., ran_to_end=True)`` ends it
completed, not preempted or requeued.

Service times are exact: each ticket names its predicted output (40 tokens at the
prior 40 tokens/s) and has a 100-token prompt (prior 8,000 tokens/s).
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from sluicegate.core.decisions import Admit, ErrorCode, Expire, Preempt
from sluicegate.core.entry import State
from sluicegate.core.scheduler import Scheduler
from sluicegate.core.spec import LaneSpec, SchedulerSpec
from sluicegate.core.ticket import Outcome, Ticket, TicketId, Usage

SERVICE_S = 100 / 8000 + 40 / 40
OK = Usage(prompt_tokens=100, completion_tokens=40)


def test_queued_ticket_is_shed_when_its_latest_start_passes(
    make_lane: Callable[..., LaneSpec],
    make_spec: Callable[..., SchedulerSpec],
    make_ticket: Callable[..., Ticket],
) -> None:
    """A ticket kept at arrival (it could start in time) leaves with 503 ``overloaded``
    (outcome ``shed``) at deadline − service once a tighter one took the slot first."""
    sched = Scheduler(make_spec(make_lane(policy="slack", shed_hopeless=True)))
    sched.submit(make_ticket("run", predicted=40, deadline=100.0), 0.0)
    sched.submit(make_ticket("loose", predicted=40, deadline=3.0), 0.0)
    sched.submit(make_ticket("tight", predicted=40, deadline=2.5), 0.0)
    admitted = sched.complete(TicketId("run"), OK, SERVICE_S)
    assert [d.ticket.id for d in admitted if isinstance(d, Admit)] == ["tight"]
    latest_start = 3.0 - SERVICE_S
    assert sched.next_wakeup() == pytest.approx(latest_start)
    assert sched.tick(latest_start - 1e-6) == []
    (expire,) = [d for d in sched.tick(latest_start) if isinstance(d, Expire)]
    assert expire.ticket.id == "loose"
    assert expire.code is ErrorCode.OVERLOADED
    assert expire.outcome is Outcome.SHED
    assert sched.state_of(TicketId("loose")) is None
    assert sched.state_of(TicketId("tight")) is State.RUNNING


def test_lane_without_shedding_keeps_late_tickets_until_their_timeout(
    make_lane: Callable[..., LaneSpec],
    make_spec: Callable[..., SchedulerSpec],
    make_ticket: Callable[..., Ticket],
) -> None:
    """Without ``shed_hopeless`` only the queue timeout removes a ticket (503 ``queue_timeout``)."""
    sched = Scheduler(make_spec(make_lane(policy="slack", queue_timeout_s=10.0)))
    sched.submit(make_ticket("run", predicted=40, deadline=100.0), 0.0)
    sched.submit(make_ticket("late", predicted=40, deadline=2.0), 0.0)
    assert sched.next_wakeup() == pytest.approx(10.0)
    (expire,) = [d for d in sched.tick(10.0) if isinstance(d, Expire)]
    assert (expire.ticket.id, expire.code, expire.outcome) == (
        "late",
        ErrorCode.QUEUE_TIMEOUT,
        Outcome.EXPIRED,
    )


def test_queue_timeout_still_applies_first_in_a_shedding_lane(
    make_lane: Callable[..., LaneSpec],
    make_spec: Callable[..., SchedulerSpec],
    make_ticket: Callable[..., Ticket],
) -> None:
    """When the queue timeout comes before the latest start, it is a ``queue_timeout``."""
    lane = make_lane(policy="slack", shed_hopeless=True, queue_timeout_s=5.0)
    sched = Scheduler(make_spec(lane))
    sched.submit(make_ticket("run", predicted=40, deadline=1000.0), 0.0)
    sched.submit(make_ticket("waits", predicted=40, deadline=100.0), 0.0)
    (expire,) = [d for d in sched.tick(5.0) if isinstance(d, Expire)]
    assert (expire.ticket.id, expire.code) == ("waits", ErrorCode.QUEUE_TIMEOUT)


@pytest.mark.parametrize("action", ["abort", "requeue"])
def test_preempt_racing_with_the_end_of_the_answer_ends_it_completed(
    action: str,
    make_lane: Callable[..., LaneSpec],
    make_spec: Callable[..., SchedulerSpec],
    make_ticket: Callable[..., Ticket],
) -> None:
    """The victim's answer ended as the ``Preempt`` was issued: ``ran_to_end`` ends it
    (not requeued), its slot goes to the waiter, and nothing is left live."""
    lanes = (
        make_lane("hi", policy="priority", preemptible="never", preempt_after_ms=100.0),
        make_lane("lo", policy="fifo", preemptible="always", preempt_action=action),
    )
    sched = Scheduler(make_spec(*lanes, max_concurrency=1))
    sched.submit(make_ticket("victim", lane="lo", priority=4, predicted=40), 0.0)
    sched.submit(make_ticket("waiter", lane="hi", priority=0, predicted=40), 0.0)
    (preempt,) = [d for d in sched.tick(0.1) if isinstance(d, Preempt)]
    assert preempt.ticket.id == "victim"
    out = sched.complete(TicketId("victim"), OK, 0.1, ran_to_end=True)
    assert [d.ticket.id for d in out if isinstance(d, Admit)] == ["waiter"]
    assert sched.state_of(TicketId("victim")) is None
    sched.complete(TicketId("waiter"), OK, 2.0)
    assert sched.live_tickets() == 0
    view = sched.view("m")
    assert view.running == 0
