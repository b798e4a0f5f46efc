"""The work-ahead structures (core/work_ahead.py) against brute force, and the queues' use.

Hypothesis drives random pushes, pops and removals (and bulk pushes, so blocks
split) and compares every sum with one recomputed from a plain list.
"""

from __future__ import annotations

import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sluicegate.core.entry import Entry, State
from sluicegate.core.policies import make_queue
from sluicegate.core.work_ahead import (
    MAX_BLOCK,
    RunningWork,
    SortedWork,
    start_estimate_s,
)
from tests.core.conftest import build_entry


def close(a: float, b: float) -> bool:
    """Equal up to the rounding of incremental sums."""
    return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-6)


_ops = st.lists(
    st.one_of(
        st.tuples(st.just("add"), st.integers(0, 50), st.floats(0.0, 100.0)),
        st.tuples(st.just("bulk"), st.integers(MAX_BLOCK, 3 * MAX_BLOCK), st.integers(0, 99)),
        st.tuples(st.just("pop"), st.just(0), st.just(0.0)),
        st.tuples(st.just("discard"), st.integers(0, 10_000), st.just(0.0)),
        st.tuples(st.just("probe"), st.integers(-1, 60), st.just(0.0)),
    ),
    max_size=60,
)


@settings(max_examples=150, deadline=None)
@given(_ops)
def test_sorted_work_matches_a_sorted_list(ops: list[tuple[str, int, float]]) -> None:
    """Under any mix of adds (also hundreds at once, so blocks split), pops of the first
    item and removals, ``SortedWork`` keeps its items in order and ``work_before`` of any
    item, held or not, equals the brute-force sum over the smaller items."""
    sw = SortedWork()
    model: list[tuple[tuple[int, int], float]] = []
    seq = 0

    def add(key: int, work: float) -> None:
        nonlocal seq
        seq += 1
        sw.add((key, seq), work)
        model.append(((key, seq), work))
        model.sort()

    for op, a, b in ops:
        if op == "add":
            add(a, b)
        elif op == "bulk":
            rng = random.Random(b)
            for _ in range(a):
                add(rng.randrange(50), rng.uniform(0.0, 10.0))
        elif op == "pop" and model:
            assert sw.pop_first() == model.pop(0)[0]
        elif op == "discard" and model:
            item, _ = model.pop(a % len(model))
            sw.discard(item)
        elif op == "probe":
            for probe in ((a, 0), (a, seq + 1), *(item for item, _ in model[:3])):
                expected = math.fsum(w for item, w in model if item < probe)
                assert close(sw.work_before(probe), expected)
        assert len(sw) == len(model)
        assert sw.first() == (model[0][0] if model else None)
        assert close(sw.total, math.fsum(w for _, w in model))
        for item, _ in model[:: max(1, len(model) // 7)]:
            assert close(sw.work_before(item), math.fsum(w for i, w in model if i < item))


def test_sorted_work_refuses_what_it_does_not_hold() -> None:
    """Removing an absent item or popping an empty structure raises; nothing changes."""
    sw = SortedWork()
    sw.add((1, 1), 2.0)
    with pytest.raises(KeyError):
        sw.discard((1, 2))
    assert len(sw) == 1
    assert sw.total == 2.0
    assert sw.pop_first() == (1, 1)
    assert sw.first() is None
    assert sw.total == 0.0
    assert sw.work_before((5, 5)) == 0.0
    with pytest.raises(IndexError):
        sw.pop_first()


@settings(max_examples=150, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(("admit", "finish", "read")),
            st.floats(0.0, 5.0),
            st.floats(0.0, 20.0),
            st.integers(0, 30),
        ),
        max_size=50,
    )
)
def test_running_work_is_the_clamped_remaining_sum(
    ops: list[tuple[str, float, float, int]],
) -> None:
    """With time moving forward, ``remaining(now)`` is Σ ``max(0, admitted_at + service_s −
    now)`` over the admitted, not finished entries, also when one is admitted again."""
    rw = RunningWork()
    running: dict[int, Entry] = {}
    now = 0.0
    for op, dt, service, pick in ops:
        now += dt
        if op == "admit" and pick not in running:
            entry = build_entry(pick, service)
            rw.add(entry)
            entry.admitted_at = now  # set after the queue hears of it, as occupy does
            running[pick] = entry
        elif op == "finish" and running:
            key = sorted(running)[pick % len(running)]
            rw.discard(running.pop(key))
        expected = math.fsum(max(0.0, e.admitted_at + e.service_s - now) for e in running.values())
        assert math.isclose(rw.remaining(now), expected, rel_tol=1e-9, abs_tol=1e-6)


@settings(max_examples=100, deadline=None)
@given(
    st.sampled_from(("fifo", "slack", "sjf", "priority")),
    st.sampled_from(("none", "vtc")),
    st.lists(
        st.tuples(st.sampled_from("abc"), st.floats(0.1, 30.0), st.floats(1.0, 200.0)),
        min_size=1,
        max_size=40,
    ),
    st.integers(0, 10),
)
def test_queue_work_ahead_follows_the_policy(
    ordering: str, fairness: str, pushes: list[tuple[str, float, float]], pops: int
) -> None:
    """Without fairness a queue's ``work_ahead`` is the service of the entries it pops first;
    with ``vtc`` it is the own tenant's work ahead A plus ``min(W, (A + S)·w/w_t)`` of the
    other backlogged tenants' queued work W and summed weight w."""
    weights = {"a": 1.0, "b": 2.0, "c": 0.5}
    queue = make_queue(ordering, fairness, aging=1.0, weights=weights)
    queue.track_work()
    entries = [
        build_entry(i + 1, service, tenant=tenant, deadline=deadline)
        for i, (tenant, service, deadline) in enumerate(pushes)
    ]
    for entry in entries:
        queue.push(entry)
    for _ in range(min(pops, len(entries) - 1)):
        queue.pop()
    waiting = [e for e in entries if e.queue_gen == 1]
    probe = build_entry(len(entries) + 1, 3.0, tenant="a", deadline=50.0)
    ahead = queue.work_ahead(probe)
    if fairness == "none":
        order: list[Entry] = []
        queue.push(probe)
        while len(queue):
            order.append(queue.pop())
        expected = math.fsum(e.service_s for e in order[: order.index(probe)])
    else:
        sub = make_queue(ordering, "none", aging=1.0, weights=weights)
        sub.track_work()
        for e in waiting:
            if e.ticket.tenant == "a":
                sub.push(e)
        own = sub.work_ahead(probe)
        x = (own + probe.service_s) / weights["a"]
        others = [e for e in waiting if e.ticket.tenant != "a"]
        others_weight = sum(weights[u] for u in {e.ticket.tenant for e in others})
        expected = own + min(math.fsum(e.service_s for e in others), x * others_weight)
    assert close(ahead, expected)


def test_queues_that_do_not_track_work_skip_it() -> None:
    """Without ``track_work`` a queue refuses ``work_ahead`` and counts no running work; the
    same queue tracking work reports the work before a new entry."""
    for track in (False, True):
        queue = make_queue("fifo", "none", aging=1.0, weights={})
        if track:
            queue.track_work()
        queue.push(build_entry(1, 2.0))
        running = build_entry(2, 5.0)
        queue.push(running)
        assert queue.pop() is not running
        queue.on_admit(queue.pop())
        third, fourth = build_entry(3, 1.0), build_entry(4, 1.0)
        if track:
            assert queue.work_ahead(third) == 0.0
        queue.push(third)
        if track:
            assert queue.work_ahead(fourth) == 1.0
        else:
            with pytest.raises(ValueError, match="track_work"):
                queue.work_ahead(fourth)
        queue.push(fourth)
        assert queue.running_work(0.0) == (5.0 if track else 0.0)


def test_start_estimate_spreads_the_work_over_the_slots() -> None:
    """(running + ahead) ÷ slots, never negative, with at least one slot."""
    assert start_estimate_s(6.0, 10.0, 4) == 4.0
    assert start_estimate_s(6.0, 10.0, 0) == 16.0
    assert start_estimate_s(0.0, 0.0, 8) == 0.0
    assert State.QUEUED.value == "queued"
