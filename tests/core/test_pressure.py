"""Cluster pressure in the core (DESIGN §5): the stage controller and the lanes it tightens.

The controller is driven with explicit readings; the scheduler with explicit ``now``
values, as the gateway's pressure loop drives it.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sluicegate.core.decisions import Admit, ErrorCode, Reject
from sluicegate.core.pressure import (
    PressureController,
    PressureSignal,
    lane_ceilings,
    lane_floor,
    max_stage,
)
from sluicegate.core.scheduler import Scheduler
from sluicegate.core.spec import default_lanes
from sluicegate.core.ticket import Outcome, Usage
from tests.core.conftest import LaneFactory, SpecFactory, TicketFactory

SIGNAL = PressureSignal("kueue", threshold=10.0, clear_below=5.0)


def test_default_lanes_tighten_best_effort_then_batch_and_never_interactive(
    make_spec: SpecFactory,
) -> None:
    """With the default lanes: stage 1 closes best_effort, stage 2 also batch; interactive
    (the first lane, no floor set) is never tightened, so there are two stages."""
    model = make_spec(*default_lanes()).models[0]
    assert max_stage([model]) == 2
    assert lane_ceilings(model, 0) == {}
    assert lane_ceilings(model, 1) == {"best_effort": 0}
    assert lane_ceilings(model, 2) == {"best_effort": 0, "batch": 0}
    assert lane_ceilings(model, 9) == {"best_effort": 0, "batch": 0}


def test_a_first_lane_with_a_floor_is_tightened_last_and_only_to_it(
    make_spec: SpecFactory, make_lane: LaneFactory
) -> None:
    """Setting ``pressure_floor`` on the first lane makes it the last stage, held at its
    floor; a later lane whose floor is its whole cap is skipped."""
    chat = make_lane("chat", max_concurrency=8, pressure_floor=3)
    keep = make_lane("keep", max_concurrency=2, pressure_floor=2)
    bulk = make_lane("bulk", max_concurrency=4, pressure_floor=1)
    model = make_spec(chat, keep, bulk).models[0]
    assert [lane_floor(model, lane) for lane in model.lanes] == [3, 2, 1]
    assert max_stage([model]) == 2
    assert lane_ceilings(model, 1) == {"bulk": 1}
    assert lane_ceilings(model, 2) == {"bulk": 1, "chat": 3}


def test_a_floor_above_the_lane_cap_is_refused(make_lane: LaneFactory) -> None:
    """A floor is what a tightened lane keeps: above its cap it would loosen it."""
    with pytest.raises(ValueError, match="pressure_floor"):
        make_lane("x", max_concurrency=2, pressure_floor=3)


def test_the_stage_climbs_one_step_per_poll_above_and_falls_with_hysteresis() -> None:
    """Above the threshold: +1 per poll up to the last stage; between clear_below and the
    threshold: unchanged; at or below clear_below: −1 per poll; a failed poll: 0."""
    controller = PressureController([SIGNAL], stages=2)
    assert [controller.observe({"kueue": 11.0}) for _ in range(3)] == [1, 2, 2]
    assert controller.observe({"kueue": 7.0}) == 2
    assert controller.observe({"kueue": 5.0}) == 1
    assert controller.observe({}) == 0  # no series: reads as 0
    controller.observe({"kueue": 50.0})
    assert controller.observe(None) == 0


@given(
    st.lists(
        st.one_of(st.none(), st.floats(min_value=-1e6, max_value=1e6, allow_nan=False)),
        max_size=60,
    ),
    st.integers(min_value=0, max_value=5),
)
def test_the_stage_stays_in_range_and_moves_at_most_one_step(
    readings: list[float | None], stages: int
) -> None:
    """Whatever the readings, the stage stays in [0, stages], moves by at most one per
    poll except to 0 on a failed poll, and rises only on a reading above the threshold."""
    controller = PressureController([SIGNAL], stages=stages)
    before = 0
    for value in readings:
        stage = controller.observe(None if value is None else {"kueue": value})
        assert 0 <= stage <= stages
        if value is None:
            assert stage == 0
        else:
            assert abs(stage - before) <= 1
            if stage > before:
                assert value > SIGNAL.threshold
            if stage < before:
                assert value <= SIGNAL.clear_below
        before = stage


def test_a_clear_level_above_the_threshold_is_refused() -> None:
    """``clear_below`` above ``threshold`` would loosen and tighten on the same value."""
    with pytest.raises(ValueError, match="clear_below"):
        PressureController([PressureSignal("k", threshold=1.0, clear_below=2.0)], stages=1)


def _three_lanes(make_spec: SpecFactory, make_lane: LaneFactory) -> Scheduler:
    lanes = (
        make_lane("interactive", max_concurrency=2),
        make_lane("batch", max_concurrency=2, pressure_floor=1),
        make_lane("best_effort", max_concurrency=2),
    )
    return Scheduler(make_spec(*lanes, max_concurrency=6))


def test_a_closed_lane_refuses_new_work_with_503_overloaded_and_the_poll_interval(
    make_spec: SpecFactory, make_lane: LaneFactory, make_ticket: TicketFactory
) -> None:
    """At stage 1 best_effort (floor 0) refuses at submit: 503 ``overloaded`` (outcome
    shed) advising a retry after the poll interval; interactive still admits."""
    scheduler = _three_lanes(make_spec, make_lane)
    scheduler.set_pressure(1, 0.0, retry_s=7.0)
    [refusal] = scheduler.submit(make_ticket("be", lane="best_effort"), 0.0)
    assert isinstance(refusal, Reject)
    assert (refusal.status, refusal.code, refusal.retry_after_s) == (503, ErrorCode.OVERLOADED, 7.0)
    assert refusal.outcome is Outcome.SHED
    [admit] = scheduler.submit(make_ticket("chat", lane="interactive"), 0.0)
    assert isinstance(admit, Admit)
    view = scheduler.view("m")
    assert [(lane.name, lane.cap, lane.tightened) for lane in view.lanes] == [
        ("interactive", 2, False),
        ("batch", 2, False),
        ("best_effort", 0, True),
    ]


def test_a_tightened_lane_keeps_its_floor_and_borrows_nothing(
    make_spec: SpecFactory, make_lane: LaneFactory, make_ticket: TicketFactory
) -> None:
    """At stage 2 batch runs at most its floor (1), although interactive's idle quota
    would lend it more, and running work is not stopped; loosening admits the waiters."""
    scheduler = _three_lanes(make_spec, make_lane)
    out = scheduler.set_pressure(2, 0.0, retry_s=5.0)
    assert out == []
    decisions = [scheduler.submit(make_ticket(f"b{i}", lane="batch"), 0.0) for i in range(3)]
    admitted = [d.ticket.id for ds in decisions for d in ds if isinstance(d, Admit)]
    assert admitted == ["b0"]
    released = scheduler.set_pressure(0, 1.0, retry_s=5.0)
    # Back to its cap of 2, and borrowing again: b1 and b2 both start.
    assert sorted(d.ticket.id for d in released if isinstance(d, Admit)) == ["b1", "b2"]
    scheduler.complete(admitted[0], Usage(100, 10), 2.0)
    assert scheduler.view("m").running == 2


def test_running_work_of_a_lane_closed_under_it_finishes(
    make_spec: SpecFactory, make_lane: LaneFactory, make_ticket: TicketFactory
) -> None:
    """Tightening is admission only: a running best_effort ticket is not preempted, and
    its lane admits nothing more until loosened."""
    scheduler = _three_lanes(make_spec, make_lane)
    [admit] = scheduler.submit(make_ticket("be0", lane="best_effort"), 0.0)
    assert isinstance(admit, Admit)
    assert scheduler.set_pressure(1, 1.0, retry_s=5.0) == []
    assert scheduler.view("m").running == 1
    scheduler.complete(admit.ticket.id, Usage(100, 10), 2.0)
    assert scheduler.view("m").running == 0
