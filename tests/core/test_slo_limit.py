"""The ``slo`` adaptive limit: quantile AIMD on time per output token and time to first token."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from sluicegate.core.limits import Limit, SampleKind, make_limit
from sluicegate.core.limits.feedback import report_outcome
from sluicegate.core.limits.slo import SloLimit, nearest_rank
from sluicegate.core.spec import AdaptiveSpec
from sluicegate.core.ticket import Feedback, Usage

FIRST = SampleKind.FIRST_TOKEN
PER_TOKEN = SampleKind.PER_OUTPUT_TOKEN


def _slo(cap: int = 64, **settings_: object) -> Limit:
    return make_limit(AdaptiveSpec.model_validate({"mode": "slo", **settings_}), cap)


def _window(
    limit: Limit, *, tpot_s: float | None, ttft_s: float = 0.05, count: int, inflight: int
) -> int:
    """``count`` answers with these timings; the limit after them."""
    for _ in range(count):
        limit.on_answer(ttft_s, inflight=inflight, kind=FIRST, tpot_s=tpot_s)
    return limit.value


def test_nearest_rank_picks_a_sample() -> None:
    """The q-quantile by nearest rank: the ⌈q·n⌉-th smallest sample."""
    samples = [5.0, 1.0, 4.0, 2.0, 3.0]
    assert nearest_rank(samples, 0.9) == 5.0
    assert nearest_rank(samples, 0.6) == 3.0
    assert nearest_rank(samples, 0.2) == 1.0
    assert nearest_rank(samples, 1.0) == 5.0
    assert nearest_rank([7.0], 0.01) == 7.0


def test_decides_only_after_a_full_window() -> None:
    """Nothing moves before ``window`` answers; the window's slow TPOT quantile then
    multiplies the limit by ``decrease``."""
    limit = _slo(cap=40, tpot_ms=20, window=4, decrease=0.5)
    assert _window(limit, tpot_s=0.030, count=3, inflight=40) == 40
    assert _window(limit, tpot_s=0.030, count=1, inflight=40) == 20


def test_quantile_tolerates_a_slow_tail_below_it() -> None:
    """With quantile 0.75 one slow answer in four is tolerated; two are not."""
    limit = _slo(cap=40, tpot_ms=20, window=4, decrease=0.5, quantile=0.75)
    _window(limit, tpot_s=0.010, count=3, inflight=40)
    _window(limit, tpot_s=0.090, count=1, inflight=40)
    assert limit.value == 40  # increased to cap again (already there)
    _window(limit, tpot_s=0.010, count=2, inflight=40)
    assert _window(limit, tpot_s=0.090, count=2, inflight=40) == 20


def test_slow_first_token_decreases_as_a_slow_tpot_does() -> None:
    """A window whose TTFT quantile is above ``ttft_ms`` decreases even with fast TPOT."""
    limit = _slo(cap=30, tpot_ms=20, ttft_ms=500, window=2, decrease=0.9)
    assert _window(limit, tpot_s=0.005, ttft_s=0.6, count=2, inflight=30) == 27


def test_fast_windows_increase_only_under_load() -> None:
    """A window meeting both targets adds ``increase`` when the busiest answer had at least
    half the limit in flight, and leaves it alone when app-limited."""
    limit = _slo(cap=40, tpot_ms=20, window=2, decrease=0.5, increase=3)
    assert _window(limit, tpot_s=0.030, count=2, inflight=40) == 20
    assert _window(limit, tpot_s=0.010, count=2, inflight=9) == 20
    limit.on_answer(0.05, inflight=3, kind=FIRST, tpot_s=0.010)
    limit.on_answer(0.05, inflight=10, kind=FIRST, tpot_s=0.010)
    assert limit.value == 23


def test_per_output_token_sample_counts_as_tpot() -> None:
    """A unary answer's time per output token is judged against ``tpot_ms``."""
    limit = _slo(cap=10, tpot_ms=20, window=1, decrease=0.5)
    limit.on_success(0.025, inflight=10, kind=PER_TOKEN)
    assert limit.value == 5
    limit.on_success(0.015, inflight=10, kind=PER_TOKEN)
    assert limit.value == 6


def test_first_token_sample_alone_is_judged_against_ttft_only() -> None:
    """A first-token sample without TPOT (a one-token answer) is not a TPOT sample."""
    limit = _slo(cap=10, tpot_ms=20, ttft_ms=1000, window=1, decrease=0.5)
    limit.on_success(0.5, inflight=5, kind=FIRST)
    assert limit.value == 10


def test_drop_decreases_at_once_and_restarts_the_window() -> None:
    """A drop multiplies by ``decrease`` immediately; the slow answers seen before it are
    forgotten, so the next window is judged on its own."""
    limit = _slo(cap=20, tpot_ms=20, window=3, decrease=0.5)
    _window(limit, tpot_s=0.050, count=2, inflight=20)
    limit.on_dropped(inflight=20)
    assert limit.value == 10
    assert _window(limit, tpot_s=0.010, count=2, inflight=10) == 10
    assert _window(limit, tpot_s=0.010, count=1, inflight=10) == 11


def test_invalid_samples_are_left_out() -> None:
    """NaN, infinite and negative samples are not judged; the answer still counts."""
    limit = _slo(cap=20, tpot_ms=20, ttft_ms=100, window=2, decrease=0.5)
    limit.on_answer(math.nan, inflight=20, kind=FIRST, tpot_s=math.inf)
    limit.on_answer(-1.0, inflight=20, kind=FIRST, tpot_s=-0.5)
    assert limit.value == 20


def test_ignore_and_kv_readings_change_nothing() -> None:
    """Ignored outcomes and KV readings neither move the limit nor count as answers."""
    limit = _slo(cap=20, tpot_ms=20, window=2, decrease=0.5)
    _window(limit, tpot_s=0.050, count=1, inflight=20)
    for _ in range(5):
        limit.on_ignore()
        limit.on_kv_usage(1.0, inflight=20)
    assert limit.value == 20
    assert _window(limit, tpot_s=0.050, count=1, inflight=20) == 10


def test_report_outcome_gives_ttft_and_tpot_of_one_answer() -> None:
    """A streamed answer of 11 tokens, first token 0.5 s and end 2.5 s after admission,
    reaches the limit as TTFT 0.5 s and TPOT (2.5 − 0.5) / 10 = 0.2 s."""
    limit = _slo(cap=10, tpot_ms=150, ttft_ms=1000, window=1, decrease=0.5)
    report_outcome(limit, Usage(100, 11, ttft_s=0.5), elapsed_s=2.5, inflight=10)
    assert limit.value == 5
    limit = _slo(cap=10, tpot_ms=250, ttft_ms=1000, window=1, decrease=0.5)
    report_outcome(limit, Usage(100, 11, ttft_s=0.5), elapsed_s=2.5, inflight=10)
    assert limit.value == 10
    report_outcome(limit, Usage(100, 11, ttft_s=0.5, feedback=Feedback.IGNORE), elapsed_s=9.0,
                   inflight=10)  # fmt: skip
    assert limit.value == 10


@pytest.mark.parametrize(
    ("field", "value"),
    [("tpot_ms", 0), ("tpot_ms", -5), ("ttft_ms", 0), ("quantile", 0), ("quantile", 1.5),
     ("window", 0)],
)  # fmt: skip
def test_settings_out_of_range_are_refused_naming_the_field(field: str, value: float) -> None:
    """Each ``slo`` setting is validated, and the error names it."""
    with pytest.raises(ValidationError, match=field):
        AdaptiveSpec.model_validate({"mode": "slo", field: value})


def _tpot_s(batch: int, base_ms: float, per_seq_ms: float) -> float:
    return (base_ms + per_seq_ms * batch) / 1e3


@settings(max_examples=80, deadline=None)
@given(
    base_ms=st.floats(min_value=2.0, max_value=20.0),
    per_seq_ms=st.floats(min_value=0.02, max_value=1.0),
    target_batch=st.integers(min_value=4, max_value=200),
    extra=st.integers(min_value=1, max_value=300),
    decrease=st.sampled_from([0.5, 0.7, 0.9]),
    increase=st.integers(min_value=1, max_value=3),
)
def test_converges_below_the_batch_whose_tpot_meets_the_target(
    base_ms: float,
    per_seq_ms: float,
    target_batch: int,
    extra: int,
    decrease: float,
    increase: int,
) -> None:
    """On a saturated engine whose TPOT grows linearly with the batch, the limit ends up
    oscillating around B*, the largest batch meeting the target: after 300 windows every
    value lies in [min(B*, ⌊decrease · (B* + 1)⌋), B* + increase] (it falls only from above
    B*, by at least one slot), it reaches at least
    B* − increase + 1 in every stretch of ~B* windows, and never leaves [floor, cap]."""
    cap = target_batch + extra
    # Target halfway between TPOT(B*) and TPOT(B* + 1): B* meets it, B* + 1 does not.
    target_ms = 1e3 * _tpot_s(target_batch, base_ms, per_seq_ms) + per_seq_ms / 2
    limit = _slo(cap=cap, tpot_ms=target_ms, window=4, decrease=decrease, increase=increase)
    values = []
    for _ in range(300 + 2 * target_batch):
        batch = limit.value
        _window(limit, tpot_s=_tpot_s(batch, base_ms, per_seq_ms), count=4, inflight=batch)
        values.append(limit.value)
        assert 1 <= limit.value <= cap
    settled = values[-(2 * target_batch + 40) :]
    assert max(settled) <= target_batch + increase
    assert min(settled) >= min(target_batch, math.floor(decrease * (target_batch + 1)))
    assert max(settled) >= target_batch - increase + 1


@settings(max_examples=60, deadline=None)
@given(
    events=st.lists(
        st.tuples(
            st.sampled_from(["answer", "drop", "ignore"]),
            st.floats(min_value=0.0, max_value=2.0),
            st.one_of(st.none(), st.floats(min_value=0.0, max_value=0.2)),
            st.integers(min_value=0, max_value=100),
        ),
        max_size=200,
    ),
    floor=st.integers(min_value=1, max_value=8),
    extra=st.integers(min_value=0, max_value=60),
)
def test_estimate_stays_in_floor_and_cap(
    events: list[tuple[str, float, float | None, int]], floor: int, extra: int
) -> None:
    """Under any answers (with or without TPOT), drops and ignores the estimate stays in
    [floor, cap] and moves only in whole slots."""
    limit = _slo(cap=floor + extra, floor=floor, window=3, tpot_ms=50)
    assert isinstance(limit, SloLimit)
    for event, rtt_s, tpot_s, inflight in events:
        if event == "answer":
            limit.on_answer(rtt_s, inflight=inflight, kind=FIRST, tpot_s=tpot_s)
        elif event == "drop":
            limit.on_dropped(inflight=inflight)
        else:
            limit.on_ignore()
        assert floor <= limit.estimate <= floor + extra
        assert limit.estimate == limit.value
