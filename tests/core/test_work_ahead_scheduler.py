"""The scheduler's start estimate: ``Queued.estimated_wait_s``, ``shed_hopeless`` and retries.

Only lanes with ``shed_hopeless`` keep the estimate's bookkeeping, so every lane
here sets it (with hour-long SLOs, nothing is shed unless a test asks).

Service times are exact here: every ticket names its predicted output (40 tokens
at the prior 40 tokens/s = 1 s) and has a 100-token prompt (at the prior 8,000
tokens/s = 0.0125 s), so each ticket's predicted service is 1.0125 s.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import pytest

from sluicegate.core.decisions import Decision, ErrorCode, Expire, Queued, Reject
from sluicegate.core.scheduler import Scheduler
from sluicegate.core.spec import LaneSpec, SchedulerSpec, TenantSpec
from sluicegate.core.ticket import Ticket

SERVICE_S = 100 / 8000 + 40 / 40


def _queued(decisions: Sequence[Decision]) -> Queued:
    found = [d for d in decisions if isinstance(d, Queued)]
    assert len(found) == 1
    return found[0]


def test_queued_estimate_is_running_remainder_plus_work_ahead(
    make_lane: Callable[..., LaneSpec],
    make_spec: Callable[..., SchedulerSpec],
    make_ticket: Callable[..., Ticket],
) -> None:
    """Behind one running ticket (1 slot), the first waiter's estimate is what is left of
    the running one; the second's adds the first's whole service."""
    sched = Scheduler(make_spec(make_lane(shed_hopeless=True)))
    sched.submit(make_ticket("a", predicted=40), 0.0)
    b = _queued(sched.submit(make_ticket("b", predicted=40, arrival=0.25), 0.25))
    c = _queued(sched.submit(make_ticket("c", predicted=40, arrival=0.25), 0.25))
    assert b.estimated_wait_s == pytest.approx(SERVICE_S - 0.25)
    assert c.estimated_wait_s == pytest.approx(2 * SERVICE_S - 0.25)


def test_estimate_spreads_over_slots_and_clamps_overrun(
    make_lane: Callable[..., LaneSpec],
    make_spec: Callable[..., SchedulerSpec],
    make_ticket: Callable[..., Ticket],
) -> None:
    """Two slots halve the work; a running ticket past its predicted end counts 0."""
    sched = Scheduler(
        make_spec(make_lane(max_concurrency=2, shed_hopeless=True), max_concurrency=2)
    )
    sched.submit(make_ticket("a", predicted=40), 0.0)
    sched.submit(make_ticket("b", predicted=40), 0.5)
    c = _queued(sched.submit(make_ticket("c", predicted=40, arrival=0.5), 0.5))
    assert c.estimated_wait_s == pytest.approx((SERVICE_S - 0.5 + SERVICE_S) / 2)
    d = _queued(sched.submit(make_ticket("d", predicted=40, arrival=1.2), 1.2))
    # a overran its prediction (ended at 1.0125): only b's rest and c's service remain.
    assert d.estimated_wait_s == pytest.approx((SERVICE_S - 0.7 + SERVICE_S) / 2)


@pytest.mark.parametrize(("policy", "shed"), [("slack", False), ("fifo", True)])
def test_shed_hopeless_follows_the_policy(
    policy: str,
    shed: bool,
    make_lane: Callable[..., LaneSpec],
    make_spec: Callable[..., SchedulerSpec],
    make_ticket: Callable[..., Ticket],
) -> None:
    """Behind 40 loose tickets (100 s deadlines), a ticket with a 30 s deadline goes first
    under ``slack`` and is kept (its wait is the running ticket's rest); under ``fifo``
    it would start after ~41 s, so it is shed with that wait as its retry hint."""
    sched = Scheduler(make_spec(make_lane(policy=policy, shed_hopeless=True)))
    sched.submit(make_ticket("run", predicted=40, deadline=100.0), 0.0)
    for i in range(40):
        sched.submit(make_ticket(f"loose{i}", predicted=40, deadline=100.0), 0.0)
    out = sched.submit(make_ticket("tight", predicted=40, deadline=30.0), 0.0)
    if shed:
        reject = next(d for d in out if isinstance(d, Reject))
        assert reject.code is ErrorCode.OVERLOADED
        assert reject.retry_after_s == pytest.approx(41 * SERVICE_S)
    else:
        assert _queued(out).estimated_wait_s == pytest.approx(SERVICE_S)


def test_expire_retry_is_the_estimate_where_it_stood(
    make_lane: Callable[..., LaneSpec],
    make_spec: Callable[..., SchedulerSpec],
    make_ticket: Callable[..., Ticket],
) -> None:
    """An expiring ticket's retry hint is its own start estimate at expiry, not the lane's
    whole drain: the second of three waiters expires 0.5 s in, behind 0.5125 s of the
    running ticket and one waiter's 1.0125 s."""
    sched = Scheduler(make_spec(make_lane(queue_timeout_s=0.5, shed_hopeless=True)))
    sched.submit(make_ticket("a", predicted=40), 0.0)
    sched.submit(make_ticket("b", predicted=40), 0.1)
    sched.submit(make_ticket("c", predicted=40), 0.0)
    sched.submit(make_ticket("d", predicted=40), 0.2)
    expired = {d.ticket.id: d for d in sched.tick(0.5) if isinstance(d, Expire)}
    assert set(expired) == {"c"}
    assert expired["c"].retry_after_s == pytest.approx(SERVICE_S - 0.5 + SERVICE_S)


def test_fair_lane_counts_the_other_tenants_share(
    make_lane: Callable[..., LaneSpec],
    make_spec: Callable[..., SchedulerSpec],
    make_ticket: Callable[..., Ticket],
) -> None:
    """``vtc``: tenant x (weight 1) queues behind y (weight 3) holding 6 tickets; its new
    ticket waits for the running rest plus y's share while x gets 1.0125 s of service:
    min(6·S, S·3) = 3·S."""
    spec = make_spec(
        make_lane(policy="fair", shed_hopeless=True),
        tenants=(TenantSpec(name="x"), TenantSpec(name="y", weight=3.0)),
    )
    sched = Scheduler(spec)
    sched.submit(make_ticket("run", tenant="y", predicted=40), 0.0)
    for i in range(6):
        sched.submit(make_ticket(f"y{i}", tenant="y", predicted=40), 0.0)
    x = _queued(sched.submit(make_ticket("x0", tenant="x", predicted=40), 0.0))
    assert x.estimated_wait_s == pytest.approx(SERVICE_S + 3 * SERVICE_S)


def test_lane_without_shedding_keeps_no_estimate(
    make_lane: Callable[..., LaneSpec],
    make_spec: Callable[..., SchedulerSpec],
    make_ticket: Callable[..., Ticket],
) -> None:
    """Without ``shed_hopeless`` ``Queued`` carries no estimate and an expiry's retry hint
    is the lane's whole drain once the ticket left, as before: (0 queued + 1) × the prior
    mean service (256 tokens at 40 tokens/s) ÷ 1 slot."""
    sched = Scheduler(make_spec(make_lane(queue_timeout_s=0.5)))
    sched.submit(make_ticket("a", predicted=40), 0.0)
    assert _queued(sched.submit(make_ticket("b", predicted=40), 0.0)).estimated_wait_s is None
    expired = [d for d in sched.tick(0.5) if isinstance(d, Expire)]
    assert [d.ticket.id for d in expired] == ["b"]
    assert expired[0].retry_after_s == pytest.approx(256 / 40)
