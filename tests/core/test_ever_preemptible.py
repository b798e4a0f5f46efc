"""``core.preemption.ever_preemptible``: whether a running ticket could ever be stopped.

The gateway sends a non-streamed request as a stream (and rebuilds its answer) only
when it could be preempted with ``abort`` (``relay_unary.py``). A ticket judged never
preemptible is sent as it came, so the judgement must never be wrong that way: each
case where it says yes is a preemption the scheduler really makes, shown here, and
where it says no, the same scenario preempts nothing. A non-streamed ticket of an
``abort`` lane under a rule that waits for part of its answer is never preempted:
it finishes (``required_fraction``).
"""

from __future__ import annotations

from typing import Any

import pytest

from sluicegate.core.decisions import Decision, Preempt
from sluicegate.core.preemption import ever_preemptible
from sluicegate.core.scheduler import Scheduler
from sluicegate.core.spec import AfterFraction, SchedulerSpec, TenantSpec
from sluicegate.core.ticket import TicketId
from tests.core.conftest import LaneFactory, SpecFactory, TicketFactory


def preempted(decisions: list[Decision]) -> list[str]:
    """Ids of the tickets ``decisions`` preempt."""
    return [d.ticket.id for d in decisions if isinstance(d, Preempt)]


HALF = AfterFraction(after_fraction=0.5)


@pytest.mark.parametrize(
    ("rule", "action", "priority", "most_important", "streaming", "expected"),
    [
        pytest.param("never", "abort", 5, 0, True, False, id="never"),
        pytest.param("priority", "abort", 1, 0, True, False, id="tiers-0-1-never"),
        pytest.param("priority", "abort", 2, 0, True, True, id="tier-2-below-a-priority-0"),
        pytest.param("priority", "abort", 2, 2, True, False, id="tier-2-none-more-important"),
        pytest.param("priority", "abort", 5, 5, True, False, id="tier-5-none-more-important"),
        pytest.param("always", "abort", 3, 2, True, True, id="always-below-the-most-important"),
        pytest.param("always", "abort", 2, 2, True, False, id="always-at-the-most-important"),
        pytest.param(HALF, "abort", 4, 0, True, True, id="after-fraction"),
        pytest.param("priority", "abort", 2, 0, False, False, id="unary-tier-2-finishes"),
        pytest.param("priority", "abort", 4, 0, False, True, id="unary-tier-4"),
        pytest.param("always", "abort", 3, 0, False, True, id="unary-always"),
        pytest.param(HALF, "abort", 4, 0, False, False, id="unary-after-fraction-finishes"),
        pytest.param(HALF, "requeue", 4, 0, False, True, id="unary-after-fraction-requeued"),
        pytest.param(HALF, "requeue", 4, 0, True, True, id="streamed-in-a-requeue-lane"),
    ],
)
def test_one_lane_without_shares(
    rule: Any,
    action: str,
    priority: int,
    most_important: int,
    streaming: bool,
    expected: bool,
    make_spec: SpecFactory,
    make_lane: LaneFactory,
) -> None:
    """In a model of one lane without tenant shares only a more important waiter can take
    a running ticket's slot: the lane's rule must allow it, and a tenant must be able to
    ask for a more important priority than the ticket's."""
    spec = make_spec(make_lane(preemptible=rule, preempt_action=action))
    model = spec.models[0]
    lane = model.lanes[0]
    assert ever_preemptible(model, lane, priority, most_important, streaming=streaming) is expected


def _urgent_waiter_scenario(
    make_ticket: TicketFactory,
    sched: Scheduler,
    victim_priority: int,
    waiter_priority: int,
    streaming: bool = True,
) -> list[str]:
    """A priority-``victim_priority`` ticket runs alone in the one-slot lane, its whole
    answer generated (streamed: reported; else: by the time estimate, long after); a
    waiter of ``waiter_priority`` arrives already urgent. What is preempted, then and
    later."""
    sched.submit(
        make_ticket("v", priority=victim_priority, max_tokens=100, streaming=streaming), 0.0
    )
    if streaming:
        sched.progress(TicketId("v"), 100)
    waiter = make_ticket("w", priority=waiter_priority, arrival=1.0, deadline=1.5, predicted=40)
    out = preempted(sched.submit(waiter, 1.0))
    for now in (5.0, 50.0):
        out += preempted(sched.tick(now))
    return out


@pytest.mark.parametrize("most_important", [0, 1, 2])
def test_a_tier_two_ticket_is_stopped_exactly_when_a_tenant_may_outrank_it(
    most_important: int, make_spec: SpecFactory, make_lane: LaneFactory, make_ticket: TicketFactory
) -> None:
    """Priority tiers, one slot: a priority-2 ticket past 80% is stopped for an urgent
    waiter of the most important priority any tenant may ask for, unless that priority
    is its own; ``ever_preemptible`` says so beforehand."""
    spec = make_spec(make_lane(preemptible="priority"), max_concurrency=1)
    model = spec.models[0]
    stopped = _urgent_waiter_scenario(make_ticket, Scheduler(spec), 2, most_important)
    assert stopped == (["v"] if most_important < 2 else [])
    exposed = ever_preemptible(model, model.lanes[0], 2, most_important, streaming=True)
    assert exposed is bool(stopped)


@pytest.mark.parametrize(("action", "expected"), [("abort", []), ("requeue", ["v"])])
def test_a_non_streamed_tier_two_ticket_finishes_in_an_abort_lane(
    action: str,
    expected: list[str],
    make_spec: SpecFactory,
    make_lane: LaneFactory,
    make_ticket: TicketFactory,
) -> None:
    """The same scenario with a non-streamed victim, long past 80% by its time estimate:
    an ``abort`` lane lets it finish (its text so far could not be kept unless streamed),
    a ``requeue`` lane stops it and runs it again later."""
    lane = make_lane(preemptible="priority", preempt_action=action)
    spec = make_spec(lane, max_concurrency=1)
    model = spec.models[0]
    stopped = _urgent_waiter_scenario(make_ticket, Scheduler(spec), 2, 0, streaming=False)
    assert stopped == expected
    assert ever_preemptible(model, lane, 2, 0, streaming=False) is bool(expected)


@pytest.mark.parametrize("borrow", [True, False])
def test_a_ticket_that_may_borrow_is_exposed_whatever_its_priority(
    borrow: bool, make_spec: SpecFactory, make_lane: LaneFactory, make_ticket: TicketFactory
) -> None:
    """Lane ``a`` runs a second ticket on lane ``b``'s idle slot; ``b``'s own ticket, of the
    same priority, takes it back by stopping the borrower. No tenant outranks it, so only
    the lane's borrowing exposes it: a lane that may not borrow queues instead."""
    lane_a = make_lane("a", borrow=borrow, preemptible="always")
    spec = make_spec(lane_a, make_lane("b"), max_concurrency=2)
    model = spec.models[0]
    sched = Scheduler(spec)
    sched.submit(make_ticket("a1", lane="a"), 0.0)
    sched.submit(make_ticket("a2", lane="a"), 0.0)
    stopped = preempted(sched.submit(make_ticket("b1", lane="b"), 1.0))
    assert stopped == (["a2"] if borrow else [])
    assert ever_preemptible(model, lane_a, 2, most_important=2, streaming=False) is borrow


@pytest.mark.parametrize(
    ("rule", "priority", "expected"),
    [
        pytest.param("always", 2, True, id="always"),
        pytest.param("priority", 4, True, id="tiers-4-5"),
        pytest.param("priority", 3, False, id="tier-3"),
    ],
)
def test_a_tenant_over_its_share_gives_a_slot_back(
    rule: str,
    priority: int,
    expected: bool,
    make_spec: SpecFactory,
    make_lane: LaneFactory,
    make_ticket: TicketFactory,
) -> None:
    """A ``vtc`` lane of 4 slots that ``noisy`` fills; ``quiet`` arrives at the same
    priority, so no tenant outranks noisy: its newest ticket is stopped for quiet's share
    when the lane's rule lets shares be given back at that priority."""
    lane = make_lane(max_concurrency=4, fairness="vtc", preemptible=rule)
    tenants = (TenantSpec(name="noisy", max_priority=priority), TenantSpec(name="quiet"))
    spec: SchedulerSpec = make_spec(lane, max_concurrency=4, tenants=tenants)
    model = spec.models[0]
    sched = Scheduler(spec)
    for i in range(4):
        sched.submit(make_ticket(f"n{i}", tenant="noisy", priority=priority), i * 0.1)
    stopped = preempted(sched.submit(make_ticket("q", tenant="quiet", priority=priority), 1.0))
    assert stopped == (["n3"] if expected else [])
    exposed = ever_preemptible(model, lane, priority, most_important=priority, streaming=False)
    assert exposed is expected
