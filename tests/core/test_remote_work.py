"""The start estimate with the other replicas' work (distributed mode, DESIGN §16):
``SortedWork.spread`` and ``RemoteWork`` against one queue holding every replica's
waiters (Hypothesis), and the scheduler's shedding and retry hints with remote work."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sluicegate.core.decisions import ErrorCode, Expire, Queued, Reject
from sluicegate.core.fair_queue import FairQueue
from sluicegate.core.policies import ORDERINGS, make_queue
from sluicegate.core.queues import HeapQueue
from sluicegate.core.scheduler import Scheduler
from sluicegate.core.spec import TenantSpec
from sluicegate.core.ticket import TicketId
from sluicegate.core.work_ahead import (
    MARKS,
    TENANT_MARKS,
    LaneWork,
    RemoteWork,
    SortedWork,
    marked_before,
)
from tests.core.conftest import LANE, LaneFactory, SpecFactory, TicketFactory, build_entry

SERVICE_S = 100 / 8000 + 40 / 40
"""A test ticket's predicted service (100 prompt tokens, 40 predicted, the priors)."""


def _close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-6)


def _head(item: tuple[object, ...]) -> tuple[float, ...]:
    """An item's order key alone (``(key, seq)`` items)."""
    head = item[0]
    assert isinstance(head, int)
    return (float(head),)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 40), st.floats(0.0, 50.0)), min_size=1, max_size=400),
    st.integers(1, 12),
)
def test_spread_marks_bound_the_work_before_any_key(
    items: list[tuple[int, float]], count: int
) -> None:
    """``spread`` takes the first and the last item and at most ``count + 1``, in order, each
    with its exact work before and after; for any key the work of the smaller items lies
    between the marks around it, so ``marked_before`` is off by at most half of
    ``total / count`` plus the largest item's work (exact past either end)."""
    sw = SortedWork()
    for seq, (key, work) in enumerate(items):
        sw.add((key, seq), work)
    ordered = sorted(((key, seq), work) for seq, (key, work) in enumerate(items))
    spread = sw.spread(count)
    assert len(spread) <= count + 1
    assert spread[0][0] == ordered[0][0]
    assert spread[-1][0] == ordered[-1][0]
    assert [item for item, _, _ in spread] == sorted(item for item, _, _ in spread)
    works: dict[object, float] = dict(ordered)
    for item, before, after in spread:
        assert _close(before, math.fsum(w for i, w in ordered if i < item))
        assert _close(after, before + works[item])
    marks = [(_head(item), before, after) for item, before, after in spread]
    keys = [mark[0] for mark in marks]
    slack = (sw.total / count + max(works.values())) / 2
    for probe in range(-1, 42):
        truth = math.fsum(w for (key, _), w in ordered if key < probe)
        estimate = marked_before(marks, keys, (float(probe),))
        assert abs(estimate - truth) <= slack + 1e-6
        if probe <= ordered[0][0][0] or probe > ordered[-1][0][0]:
            assert _close(estimate, truth)


_waiters = st.lists(
    st.tuples(
        st.integers(0, 2),  # the replica holding it (0: this one)
        st.sampled_from("abc"),
        st.floats(0.1, 30.0),
        st.floats(1.0, 500.0),
        st.integers(0, 3),
    ),
    max_size=300,
)


@settings(max_examples=150, deadline=None)
@given(st.sampled_from(("fifo", "slack", "sjf", "priority")), _waiters, st.floats(1.0, 500.0))
def test_remote_ahead_matches_one_queue_holding_every_replicas_waiters(
    ordering: str, waiters: list[tuple[int, str, float, float, int]], deadline: float
) -> None:
    """Waiters spread over three replicas: this replica's ``work_ahead`` plus ``RemoteWork``
    over the other two's published marks is the work one queue holding all of them runs
    before a new ticket, to within half a mark step plus the largest waiter per replica
    (and ties of the order key); exact under ``fifo`` (a new ticket is behind them all)."""
    key = ORDERINGS.get(ordering)(1.0).key
    queues = [HeapQueue(key) for _ in range(4)]  # three replicas, then one holding everything
    for queue in queues:
        queue.track_work()
    entries = []
    for seq, (replica, tenant, service, due, priority) in enumerate(waiters, start=1):
        for queue in (queues[replica], queues[3]):
            entry = build_entry(seq, service, tenant=tenant, deadline=due, priority=priority)
            queue.push(entry)
        entries.append((replica, entry))
    probe = build_entry(len(waiters) + 1, 3.0, tenant="a", deadline=deadline, priority=1)
    works = [LaneWork(0, 0.0, len(q), q.total_work, marks=q.work_marks(MARKS)) for q in queues[1:3]]
    estimate = queues[0].work_ahead(probe) + RemoteWork(works).ahead(key(probe))
    truth = queues[3].work_ahead(probe)
    if ordering == "fifo":
        assert _close(estimate, truth)
        return
    slack = 0.0
    for replica in (1, 2):
        mine = [e for r, e in entries if r == replica]
        if mine:
            slack += (math.fsum(e.service_s for e in mine) / MARKS) / 2
            slack += max(e.service_s for e in mine) / 2
            slack += math.fsum(e.service_s for e in mine if key(e) == key(probe))
    assert abs(estimate - truth) <= slack + 1e-6


@settings(max_examples=150, deadline=None)
@given(st.sampled_from(("fifo", "slack")), _waiters, st.sampled_from("abcd"), st.booleans())
def test_fair_remote_work_is_gps_over_every_replicas_tenants(
    ordering: str,
    waiters: list[tuple[int, str, float, float, int]],
    tenant: str,
    remote_first: bool,
) -> None:
    """``vtc``: ``work_ahead_with`` the other replicas' per-tenant work (the ticket's own
    tenant's placed by its marks) is the ``work_ahead`` of one queue holding every
    replica's waiters, to within half a mark step plus the largest of the tenant's waiters
    there (and ties); exact under ``fifo`` within tenants when the others' waiters came
    first. A tenant backlogged only elsewhere joins the weight (``d`` has none set)."""
    weights = {"a": 1.0, "b": 2.0, "c": 0.5}
    queues = [make_queue(ordering, "vtc", aging=1.0, weights=weights) for _ in range(3)]
    here, others, everything = queues
    ordered = sorted(waiters, key=lambda waiter: waiter[0] == 0) if remote_first else waiters
    for queue in queues:
        queue.track_work()
    for seq, (replica, name, service, due, priority) in enumerate(ordered, start=1):
        for queue in (here if replica == 0 else others, everything):
            queue.push(build_entry(seq, service, tenant=name, deadline=due, priority=priority))
    assert isinstance(here, FairQueue)
    assert isinstance(others, FairQueue)
    probe = build_entry(len(ordered) + 1, 3.0, tenant=tenant, deadline=50.0, priority=1)
    tenants = others.tenant_work(TENANT_MARKS)
    remote = RemoteWork([LaneWork(0, 0.0, len(others), 0.0, tenants=tenants)])
    key = ORDERINGS.get(ordering)(1.0).key
    own = remote.ahead(key(probe), tenant)
    estimate = here.work_ahead_with(probe, own, remote.tenants)
    truth = everything.work_ahead(probe)
    if ordering == "fifo" and remote_first:
        assert _close(estimate, truth)
        return
    mine = [
        build_entry(1, service, tenant=name, deadline=due, priority=priority)
        for replica, name, service, due, priority in ordered
        if replica != 0 and name == tenant
    ]
    slack = 0.0
    if mine:
        slack += math.fsum(e.service_s for e in mine) / TENANT_MARKS / 2
        slack += max(e.service_s for e in mine) / 2
        slack += math.fsum(e.service_s for e in mine if key(e) == key(probe))
    # The own tenant's error moves the GPS share of the others too: by at most w/w_t of it.
    factor = 1 + (sum(weights.values()) + 1.0) / min(weights.values())
    assert abs(estimate - truth) <= slack * factor + 1e-6


def _shared(make_spec: SpecFactory, make_lane: LaneFactory, **lane: object) -> Scheduler:
    """A scheduler in distributed mode with one shedding lane of 2 slots."""
    spec = make_spec(
        make_lane(max_concurrency=2, shed_hopeless=True, **lane),
        max_concurrency=2,
        tenants=(TenantSpec(name="t"), TenantSpec(name="u", weight=3.0)),
    )
    sched = Scheduler(spec)
    sched.use_store(0.0)
    return sched


def _fifo_burst(waiting: int, *, at: float = 0.0) -> RemoteWork:
    """Another replica's FIFO lane: 2 running with 3 s of work left, ``waiting`` queued of
    ``SERVICE_S`` each, arrived at ``at``."""
    marks = tuple(((at,), i * SERVICE_S, (i + 1) * SERVICE_S) for i in range(waiting))
    return RemoteWork([LaneWork(2, 3.0, waiting, waiting * SERVICE_S, marks=marks)])


def test_a_burst_at_another_replica_sheds_here(
    make_spec: SpecFactory, make_lane: LaneFactory, make_ticket: TicketFactory
) -> None:
    """An idle replica alone would keep a ticket with a 10 s deadline (wait 0); with 20
    tickets queued elsewhere (FIFO: all ahead) its wait is (3 + 20·S) ÷ 2 slots, so it is
    shed with that as its retry hint; once the burst drained it is kept again."""
    sched = _shared(make_spec, make_lane)
    ticket = make_ticket("a", predicted=40, arrival=1.0, deadline=11.0)
    sched.set_remote_work("m", {LANE: _fifo_burst(20)})
    (reject,) = sched.submit(ticket, 1.0)
    assert isinstance(reject, Reject)
    assert reject.code is ErrorCode.OVERLOADED
    assert reject.retry_after_s == pytest.approx((3.0 + 20 * SERVICE_S) / 2)
    sched.set_remote_work("m", {})
    queued = sched.submit(ticket, 1.0)[0]
    assert queued == Queued(ticket, 0.0)


def test_other_replicas_running_work_fills_the_slots(
    make_spec: SpecFactory, make_lane: LaneFactory, make_ticket: TicketFactory
) -> None:
    """Nothing waits anywhere, but the other replicas run the lane's 2 slots: a new ticket
    waits for their running work (3 s ÷ 2), not 0."""
    sched = _shared(make_spec, make_lane)
    sched.set_remote_work("m", {LANE: _fifo_burst(0)})
    queued = sched.submit(make_ticket("a", predicted=40), 0.0)[0]
    assert isinstance(queued, Queued)
    assert queued.estimated_wait_s == pytest.approx(3.0 / 2)


def test_slack_puts_a_tight_ticket_before_the_others_loose_waiters(
    make_spec: SpecFactory, make_lane: LaneFactory, make_ticket: TicketFactory
) -> None:
    """``slack``: the other replica's 20 waiters start at the latest at 100 s; a ticket that
    must start by 9 s goes before all of them (their running work only) and is kept; one
    that may start at 200 s is behind all of them."""
    sched = _shared(make_spec, make_lane, policy="slack")
    sched.set_remote_work("m", {LANE: _fifo_burst(20, at=100.0)})
    tight = sched.submit(make_ticket("tight", predicted=40, deadline=10.0), 0.0)[0]
    assert isinstance(tight, Queued)
    assert tight.estimated_wait_s == pytest.approx(3.0 / 2)
    loose = sched.submit(make_ticket("loose", predicted=40, deadline=201.0), 0.0)[0]
    assert isinstance(loose, Queued)
    assert loose.estimated_wait_s == pytest.approx((3.0 + SERVICE_S + 20 * SERVICE_S) / 2)


def test_fair_lane_adds_the_other_replicas_tenants(
    make_spec: SpecFactory, make_lane: LaneFactory, make_ticket: TicketFactory
) -> None:
    """``fair``: tenant t's ticket, with u (weight 3) backlogged only on another replica
    with 6 tickets: it waits for their running work plus u's share while t gets S:
    min(6·S, 3·S) = 3·S, over 2 slots. t's own 2 tickets there, due at 100 s, are behind
    a tight ticket of t (``slack`` within t) and ahead of a loose one, whose GPS share
    of u grows with them: min(6·S, 3·3·S)."""
    sched = _shared(make_spec, make_lane, policy="fair")
    own = tuple(((100.0,), i * SERVICE_S, (i + 1) * SERVICE_S) for i in range(2))
    tenants = (("u", 6 * SERVICE_S, ()), ("t", 2 * SERVICE_S, own))
    works = [LaneWork(2, 3.0, 8, 8 * SERVICE_S, tenants=tenants)]
    sched.set_remote_work("m", {LANE: RemoteWork(works)})
    tight = sched.submit(make_ticket("a", tenant="t", predicted=40, deadline=10.0), 0.0)[0]
    assert isinstance(tight, Queued)
    assert tight.estimated_wait_s == pytest.approx((3.0 + 3 * SERVICE_S) / 2)
    loose = sched.submit(make_ticket("b", tenant="t", predicted=40, deadline=200.0), 0.0)[0]
    assert isinstance(loose, Queued)
    assert loose.estimated_wait_s == pytest.approx((3.0 + 3 * SERVICE_S + 6 * SERVICE_S) / 2)


def test_the_latest_start_retry_hint_counts_the_other_replicas(
    make_spec: SpecFactory, make_lane: LaneFactory, make_ticket: TicketFactory
) -> None:
    """A queued ticket that reaches its latest start leaves with 503 ``overloaded`` and a
    retry hint that is its start estimate there, the other replicas' work included."""
    sched = _shared(make_spec, make_lane)
    ticket = make_ticket("a", predicted=40, arrival=1.0, deadline=5.0)
    assert isinstance(sched.submit(ticket, 1.0)[0], Queued)
    sched.set_remote_work("m", {LANE: _fifo_burst(4)})
    (expired,) = [d for d in sched.tick(5.0) if isinstance(d, Expire)]
    assert expired.code is ErrorCode.OVERLOADED
    assert expired.retry_after_s == pytest.approx((3.0 + 4 * SERVICE_S) / 2)


def test_remote_work_counts_only_while_the_store_admits(
    make_spec: SpecFactory, make_lane: LaneFactory, make_ticket: TicketFactory
) -> None:
    """``lose_store`` clears the other replicas' work (the fallback sees its own only), and
    ``set_remote_work`` outside distributed mode is ignored."""
    sched = _shared(make_spec, make_lane)
    sched.set_remote_work("m", {LANE: _fifo_burst(20)})
    sched.lose_store(0.0, fail_open=True, share=0.5)
    assert sched.submit(make_ticket("a", predicted=40, deadline=10.0), 0.0)[0].ticket.id == "a"
    assert sched.state_of(TicketId("a")) is not None
    sched.set_remote_work("m", {LANE: _fifo_burst(20)})
    assert sched.submit(make_ticket("b", predicted=40, deadline=10.0), 0.0) != []
    assert sched.state_of(TicketId("b")) is not None  # not shed: nothing remote counts


def test_work_summary_is_what_another_replica_needs(
    make_spec: SpecFactory, make_lane: LaneFactory, make_ticket: TicketFactory
) -> None:
    """``work_summary``: running units and their remaining work, the queue's count, work and
    marks (fifo: every waiter, keyed by arrival); a vtc lane gives its tenants' work."""
    sched = _shared(make_spec, make_lane)
    for i, name in enumerate("abcd"):
        sched.submit(make_ticket(name, predicted=40, arrival=float(i)), float(i))
    sched.grant(TicketId("a"), 3.0)
    summary = sched.work_summary("m", 3.5)[LANE]
    assert (summary.running, summary.waiting) == (1, 3)
    assert summary.running_s == pytest.approx(SERVICE_S - 0.5)
    assert summary.waiting_s == pytest.approx(3 * SERVICE_S)
    assert [mark[0] for mark in summary.marks] == [(1.0,), (2.0,), (3.0,)]
    assert summary.marks[-1][2] == pytest.approx(3 * SERVICE_S)
    fair = _shared(make_spec, make_lane, policy="fair")
    fair.submit(make_ticket("x", tenant="u", predicted=40), 0.0)
    ((tenant, seconds, marks),) = fair.work_summary("m", 0.0)[LANE].tenants
    assert tenant == "u"
    assert seconds == pytest.approx(SERVICE_S)
    # slack within the tenant: keyed by the latest start (the lane's 3600 s SLO).
    ((key, before, after),) = marks
    assert key == pytest.approx((3600.0 - SERVICE_S, 2))
    assert before == 0.0
    assert after == pytest.approx(SERVICE_S)
