"""Tickets of several units (a request's ``n`` choices): each takes ``units`` of every
concurrency count — the model's, its lane's, its backend's and its tenant's share — and a
head that needs more units than are free waits for them without being overtaken."""

from __future__ import annotations

import pytest

from sluicegate.core.component_specs import BackendSpec
from sluicegate.core.decisions import Admit
from sluicegate.core.scheduler import Scheduler
from sluicegate.core.spec import ModelSpec, SchedulerSpec
from sluicegate.core.ticket import TicketId, Usage
from tests.core.conftest import MODEL, admitted_ids, build_lane, build_spec, build_ticket

DONE = Usage(10, 10)


def _running(sched: Scheduler) -> tuple[int, int, int]:
    """(model running, lane own, backend b0 in flight)."""
    view = sched.view(MODEL)
    return view.running, view.lanes[0].own, view.backends[0].inflight


def test_a_ticket_of_three_units_takes_three() -> None:
    """Cap 4: a 3-unit ticket runs and counts 3 everywhere; a 1-unit one fills the fourth
    unit; the next waits; each completion gives back what it took."""
    sched = Scheduler(build_spec(build_lane(max_concurrency=4), max_concurrency=4))
    assert admitted_ids(sched.submit(build_ticket("three", units=3), 0.0)) == ["three"]
    assert _running(sched) == (3, 3, 3)
    assert admitted_ids(sched.submit(build_ticket("one", units=1), 0.0)) == ["one"]
    assert admitted_ids(sched.submit(build_ticket("wait", units=1), 0.0)) == []
    assert _running(sched) == (4, 4, 4)
    assert admitted_ids(sched.complete(TicketId("three"), DONE, 1.0)) == ["wait"]
    assert _running(sched) == (2, 2, 2)


def test_a_head_short_of_units_waits_and_later_lanes_do_not_take_them() -> None:
    """Cap 4 with 3 units busy: a 2-unit head of the first lane waits; a 1-unit ticket of
    the second lane does not take the free unit meanwhile; when one unit frees, the head
    runs, then the other."""
    lanes = (build_lane("a", max_concurrency=4), build_lane("b", max_concurrency=4))
    sched = Scheduler(build_spec(*lanes, max_concurrency=4))
    assert admitted_ids(sched.submit(build_ticket("busy", lane="b", units=3), 0.0)) == ["busy"]
    assert admitted_ids(sched.submit(build_ticket("two", lane="a", units=2), 0.0)) == []
    assert admitted_ids(sched.submit(build_ticket("small", lane="b"), 0.0)) == []
    assert sched.view(MODEL).running == 3
    assert admitted_ids(sched.complete(TicketId("busy"), DONE, 1.0)) == ["two", "small"]
    assert sched.view(MODEL).running == 3


def test_a_lane_quota_counts_units() -> None:
    """A lane of quota 2 runs one 2-unit ticket, not a second beside a 1-unit one."""
    sched = Scheduler(build_spec(build_lane(max_concurrency=2), max_concurrency=8))
    assert admitted_ids(sched.submit(build_ticket("one"), 0.0)) == ["one"]
    assert admitted_ids(sched.submit(build_ticket("two", units=2), 0.0)) == []
    assert admitted_ids(sched.complete(TicketId("one"), DONE, 1.0)) == ["two"]
    assert _running(sched) == (2, 2, 2)


@pytest.mark.parametrize("units", [5, 9])
def test_more_units_than_any_cap_run_alone_rather_than_never(units: int) -> None:
    """A ticket of more units than the model's cap is not stuck: it runs once nothing
    else does, alone."""
    sched = Scheduler(build_spec(build_lane(max_concurrency=4), max_concurrency=4))
    assert admitted_ids(sched.submit(build_ticket("one"), 0.0)) == ["one"]
    assert admitted_ids(sched.submit(build_ticket("big", units=units), 0.0)) == []
    assert admitted_ids(sched.complete(TicketId("one"), DONE, 1.0)) == ["big"]
    assert _running(sched) == (units, units, units)
    assert admitted_ids(sched.submit(build_ticket("after"), 1.0)) == []


def test_a_backend_cap_counts_units() -> None:
    """Backends of 2 slots each: a 2-unit ticket goes to the idle one, not beside a
    running ticket."""
    model = ModelSpec(
        name=MODEL,
        backends=(
            BackendSpec(name="b0", max_concurrency=2),
            BackendSpec(name="b1", max_concurrency=2),
        ),
        lanes=(build_lane(max_concurrency=8),),
        max_concurrency=8,
        router="least_inflight",
    )
    sched = Scheduler(SchedulerSpec(models=(model,)))
    decisions = sched.submit(build_ticket("one"), 0.0) + sched.submit(
        build_ticket("two", units=2), 0.0
    )
    backends = [d.backend for d in decisions if isinstance(d, Admit)]
    assert len(set(backends)) == 2, decisions
    assert admitted_ids(sched.submit(build_ticket("three", units=2), 0.0)) == []


def test_units_scale_the_predicted_tokens() -> None:
    """A 4-unit ticket's ``max_tokens`` covers its four choices: it charges the token
    budget four times what one choice of the same length does."""
    sched = Scheduler(build_spec(build_lane(max_concurrency=8), max_concurrency=8))
    sched.submit(build_ticket("one", max_tokens=100), 0.0)
    sched.submit(build_ticket("four", max_tokens=400, units=4), 0.0)
    costs = {lease.ticket: lease.cost_tokens for lease in sched.running_leases(MODEL, 0.0)}
    one, four = (next(t for t in costs if t.id == name) for name in ("one", "four"))
    assert costs[four] - four.prompt_tokens == 4 * (costs[one] - one.prompt_tokens)


@pytest.mark.parametrize("units", [0, -1])
def test_units_below_one_are_refused(units: int) -> None:
    """A ticket holds at least one unit."""
    with pytest.raises(ValueError, match="units"):
        build_ticket("x", units=units)
