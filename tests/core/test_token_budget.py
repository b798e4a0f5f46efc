"""The in-flight token budget by default (DESIGN §5): ``max_inflight_tokens: auto``.

An ``auto`` budget is derived from the KV capacity the backends report through
``BackendStats.kv_capacity_tokens``: the sum over all backends times the model's
KV watermark, and no budget while any backend's capacity is unknown. A number
overrides it; ``null``/``"off"`` disables it.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from sluicegate.core.decisions import Admit
from sluicegate.core.scheduler import Scheduler
from sluicegate.core.spec import KV_WATERMARK, AdaptiveSpec, ModelSpec
from sluicegate.core.ticket import BackendStats, TicketId, Usage
from tests.core.conftest import MODEL, admitted_ids, build_lane, build_spec, build_ticket

WIDE = build_lane(max_concurrency=64)


def _capacity(sched: Scheduler, backend: str, tokens: int, now: float = 0.0) -> None:
    sched.observe_backend(BackendStats(MODEL, backend, kv_capacity_tokens=tokens), now)


def _budget(sched: Scheduler) -> int | None:
    return sched.view(MODEL).max_inflight_tokens


@pytest.mark.parametrize(
    ("value", "parsed"),
    [(None, None), ("off", None), (False, None), ("auto", "auto"), (5, 5), ("7", 7)],
)
def test_accepted_values(value: object, parsed: object) -> None:
    """``null``, ``"off"`` and false (YAML's bare ``off``) mean no budget, ``"auto"``
    derives one, a number is the budget."""
    assert ModelSpec(name=MODEL, max_inflight_tokens=value).max_inflight_tokens == parsed


def test_default_is_auto() -> None:
    """A model that does not set ``max_inflight_tokens`` gets ``auto``."""
    assert ModelSpec(name=MODEL).max_inflight_tokens == "auto"


@pytest.mark.parametrize("value", [0, -1, "on", "none", True, 1.5])
def test_refused_values(value: object) -> None:
    """Anything else is refused, naming the field."""
    with pytest.raises(ValidationError, match="max_inflight_tokens"):
        ModelSpec(name=MODEL, max_inflight_tokens=value)


def test_auto_budget_is_unknown_until_every_backend_reports() -> None:
    """No budget until all backends reported their capacity; then 0.9 × the sum."""
    sched = Scheduler(build_spec(WIDE, backends=("b0", "b1")))
    assert _budget(sched) is None
    _capacity(sched, "b0", 100_000)
    assert _budget(sched) is None
    _capacity(sched, "b1", 50_000)
    assert _budget(sched) == int(150_000 * KV_WATERMARK) == 135_000
    _capacity(sched, "b1", 60_000)
    assert _budget(sched) == 144_000


def test_auto_budget_ignores_kv_cache_high_water() -> None:
    """A ``kv_cache`` adaptive limit's ``high_water`` does not tighten the budget: it stays
    0.9 × capacity, leaving the limit room to act below it."""
    adaptive = AdaptiveSpec(mode="kv_cache", high_water=0.5, low_water=0.2)
    sched = Scheduler(build_spec(WIDE, adaptive=adaptive))
    _capacity(sched, "b0", 100_000)
    assert _budget(sched) == 90_000


@pytest.mark.parametrize(("value", "budget"), [(1000, 1000), (None, None), ("off", None)])
def test_explicit_setting_ignores_reported_capacity(value: object, budget: int | None) -> None:
    """A configured number, ``null`` or ``"off"`` is not replaced by the reported capacity."""
    sched = Scheduler(build_spec(WIDE, max_inflight_tokens=value))
    _capacity(sched, "b0", 100_000)
    assert _budget(sched) == budget


def test_derived_budget_blocks_what_does_not_fit_and_huge_runs_alone() -> None:
    """The derived budget (900 of 1000) holds back a head that would overflow it; a request
    larger than the whole budget still runs once nothing else does."""
    sched = Scheduler(build_spec(WIDE))
    _capacity(sched, "b0", 1000)
    a = build_ticket("a", prompt_tokens=400, predicted=100)
    b = build_ticket("b", prompt_tokens=400, predicted=100)
    huge = build_ticket("huge", prompt_tokens=5000, predicted=100, max_tokens=100)
    assert admitted_ids(sched.submit(a, 0.0)) == ["a"]
    assert admitted_ids(sched.submit(b, 0.0)) == []  # 500 + 500 > 900
    assert admitted_ids(sched.submit(huge, 0.0)) == []
    assert sched.view(MODEL).inflight_tokens == 500
    assert admitted_ids(sched.complete(TicketId("a"), Usage(400, 100), 1.0)) == ["b"]
    assert admitted_ids(sched.complete(TicketId("b"), Usage(400, 100), 2.0)) == ["huge"]
    assert sched.view(MODEL).inflight_tokens == 5100


def test_reported_capacity_admits_what_was_waiting() -> None:
    """Learning a larger capacity admits the queued heads that now fit, at once."""
    sched = Scheduler(build_spec(WIDE))
    _capacity(sched, "b0", 1000)
    assert admitted_ids(sched.submit(build_ticket("a", prompt_tokens=800, predicted=50), 0.0))
    assert not admitted_ids(sched.submit(build_ticket("b", prompt_tokens=800, predicted=50), 0.0))
    decisions = sched.observe_backend(BackendStats(MODEL, "b0", kv_capacity_tokens=2000), 1.0)
    assert [d.ticket.id for d in decisions if isinstance(d, Admit)] == ["b"]


@settings(max_examples=60, deadline=None)
@given(
    capacity=st.integers(1, 20_000),
    sizes=st.lists(st.tuples(st.integers(1, 8000), st.integers(1, 2000)), max_size=30),
    finish=st.lists(st.booleans(), max_size=30),
)
def test_running_tokens_stay_within_derived_budget(
    capacity: int, sizes: list[tuple[int, int]], finish: list[bool]
) -> None:
    """Whenever more than one ticket runs, their prompt + predicted output is within the
    derived budget; whenever the model is idle, a waiting ticket is admitted."""
    sched = Scheduler(build_spec(WIDE))
    _capacity(sched, "b0", capacity)
    budget = _budget(sched)
    assert budget == max(1, int(capacity * KV_WATERMARK))
    running: list[str] = []
    for i, (prompt, predicted) in enumerate(sizes):
        now = float(i)
        ticket = build_ticket(f"t{i}", prompt_tokens=prompt, predicted=predicted)
        running += admitted_ids(sched.submit(ticket, now))
        if i < len(finish) and finish[i] and running:
            done = running.pop(0)
            running += admitted_ids(sched.complete(TicketId(done), Usage(1, 1), now))
        view = sched.view(MODEL, now)
        assert view.running == len(running)
        if view.running > 1:
            assert view.inflight_tokens <= budget
        assert view.running > 0 or view.queued == 0
