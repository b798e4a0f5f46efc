"""Tests for per-lane summaries, rendered tables and run comparisons."""

from __future__ import annotations

import dataclasses
import io
from dataclasses import fields

import numpy as np
import pytest
from rich.console import Console
from rich.table import Table

from sluicegate.bench import (
    OVERALL,
    LaneSummary,
    RequestRecord,
    compare,
    render_summary,
    status_class,
    summarize,
)
from sluicegate.outcomes import OutcomeStats


def _rec(
    index: int,
    *,
    lane: str = "interactive",
    status: int = 200,
    e2e_s: float = 1.0,
    ttft_s: float | None = 0.1,
    queue_ms: float | None = None,
    deadline_ms: float | None = None,
    tokens: int = 10,
    scheduled_s: float = 0.0,
    launch_lag_s: float = 0.0,
) -> RequestRecord:
    return RequestRecord(
        index=index,
        tenant="t",
        lane=lane,
        priority=2,
        prompt_tokens=10,
        max_tokens=tokens,
        deadline_ms=deadline_ms,
        scheduled_s=scheduled_s,
        launch_lag_s=launch_lag_s,
        status=status,
        error="" if status == 200 else "queue_full",
        queue_ms=queue_ms,
        retry_after_s=None,
        ttft_s=ttft_s if status == 200 else None,
        e2e_s=e2e_s,
        output_tokens=tokens if status == 200 else 0,
        itl_mean_s=0.01 if status == 200 else None,
        itl_max_s=0.02 if status == 200 else None,
        finish_reason="length" if status == 200 else "",
    )


def _by_lane(summaries: list[LaneSummary]) -> dict[str, LaneSummary]:
    return {s.lane: s for s in summaries}


def _render(table: Table) -> str:
    buffer = io.StringIO()
    Console(file=buffer, width=250, color_system=None).print(table)
    return buffer.getvalue()


def test_percentiles_match_numpy_over_successful_requests() -> None:
    """TTFT, e2e and queue-wait percentiles equal numpy's linear percentiles of successes."""
    rng = np.random.default_rng(7)
    e2es, ttfts, queues = (
        rng.exponential(1.0, 200),
        rng.exponential(0.1, 200),
        rng.exponential(50, 200),
    )
    records = [
        _rec(i, e2e_s=float(e), ttft_s=float(t), queue_ms=float(q))
        for i, (e, t, q) in enumerate(zip(e2es, ttfts, queues, strict=True))
    ]
    records.append(_rec(999, status=429, e2e_s=100.0))
    overall = _by_lane(summarize(records))[OVERALL]
    expected = np.percentile(e2es, [50, 90, 99, 99.9])
    assert [overall.e2e.p50, overall.e2e.p90, overall.e2e.p99, overall.e2e.p999] == pytest.approx(
        expected
    )
    assert overall.ttft.p99 == pytest.approx(np.percentile(ttfts, 99))
    assert overall.queue_wait.p50 == pytest.approx(np.percentile(queues, 50) / 1000.0)


def test_status_counts_split_2xx_429_503_and_other() -> None:
    """Every request falls in exactly one status class; status 0 counts as other."""
    statuses = [200, 200, 429, 503, 503, 500, 0]
    summary = _by_lane(summarize([_rec(i, status=s) for i, s in enumerate(statuses)]))[OVERALL]
    assert dict(summary.status_counts) == {"2xx": 2, "429": 1, "503": 2, "other": 2}
    assert summary.succeeded == 2
    assert status_class(0) == "other"


def test_slo_attainment_counts_rejections_as_misses_and_prefers_own_deadline() -> None:
    """Attainment = succeeded within SLO / all; a request's own deadline beats its lane's."""
    records = [
        _rec(0, e2e_s=0.5),  # within the lane's 1000 ms
        _rec(1, e2e_s=1.5),  # misses the lane's SLO
        _rec(2, e2e_s=1.5, deadline_ms=2000.0),  # own deadline met
        _rec(3, status=429),  # rejected: a miss
    ]
    lane = _by_lane(summarize(records, {"interactive": 1000.0}))["interactive"]
    assert lane.slo_attainment == pytest.approx(2 / 4)
    assert lane.slo_ms == 1000.0


def test_deadlines_run_from_the_launch_not_the_schedule() -> None:
    """A request launched late by the generator is judged on the server's latency alone."""
    records = [_rec(0, e2e_s=0.5, launch_lag_s=2.0), _rec(1, e2e_s=1.5, launch_lag_s=0.0)]
    lane = _by_lane(summarize(records, {"interactive": 1000.0}))["interactive"]
    assert lane.slo_attainment == pytest.approx(1 / 2)
    assert lane.e2e.p50 == pytest.approx(1.0)


def test_shared_figures_are_the_shared_summary_of_the_outcomes() -> None:
    """Every figure ``OutcomeStats`` defines equals its value over ``as_outcome`` records."""
    records = [
        _rec(0, e2e_s=0.5, queue_ms=20.0),
        _rec(1, e2e_s=1.5, deadline_ms=2000.0, scheduled_s=1.0),
        _rec(2, status=429),
        _rec(3, lane="batch", e2e_s=3.0, queue_ms=5.0),
    ]
    slos = {"interactive": 1000.0}
    overall = _by_lane(summarize(records, slos, span_s=5.0))[OVERALL]
    shared = OutcomeStats.of([r.as_outcome(slos.get(r.lane)) for r in records], 5.0)
    assert {f.name: getattr(overall, f.name) for f in fields(OutcomeStats)} == {
        f.name: getattr(shared, f.name) for f in fields(OutcomeStats)
    }
    assert overall.slo_attainment == pytest.approx(3 / 4)  # batch has no SLO: completing is good
    assert dict(overall.outcomes) == {"completed": 3, "queue_full": 1}


def test_queue_wait_counts_every_admitted_request_and_throughput_every_token() -> None:
    """An admitted request whose stream broke off has a queue wait and produced tokens."""
    broken = dataclasses.replace(
        _rec(1, queue_ms=40.0, tokens=6), error="stream_interrupted", output_tokens=6
    )
    summary = _by_lane(summarize([_rec(0, queue_ms=20.0, tokens=4), broken], span_s=2.0))[OVERALL]
    assert summary.queue_wait.count == 2
    assert summary.queue_wait.mean == pytest.approx(0.03)
    assert summary.succeeded == 1
    assert summary.throughput_tokens_per_s == pytest.approx(5.0)
    assert summary.goodput_tokens_per_s == pytest.approx(2.0)


def test_attainment_is_none_without_any_slo() -> None:
    """A group where no request has an SLO reports no attainment; goodput counts successes."""
    summary = _by_lane(summarize([_rec(0), _rec(1, status=503)], span_s=2.0))[OVERALL]
    assert summary.slo_attainment is None
    assert summary.goodput_rps == pytest.approx(0.5)


def test_goodput_divides_good_requests_and_tokens_by_span() -> None:
    """Goodput = good requests (tokens) / span; throughput counts every success's tokens."""
    records = [_rec(0, e2e_s=0.5, tokens=10), _rec(1, e2e_s=3.0, tokens=30, scheduled_s=1.0)]
    summary = _by_lane(summarize(records, {"interactive": 1000.0}))[OVERALL]
    assert summary.span_s == pytest.approx(4.0)
    assert summary.goodput_rps == pytest.approx(1 / 4.0)
    assert summary.goodput_tokens_per_s == pytest.approx(10 / 4.0)
    assert summary.throughput_tokens_per_s == pytest.approx(40 / 4.0)


def test_lanes_come_in_first_seen_order_then_overall() -> None:
    """One summary per lane in order of first appearance, the overall one last."""
    records = [_rec(0, lane="batch"), _rec(1, lane="interactive"), _rec(2, lane="batch")]
    summaries = summarize(records)
    assert [s.lane for s in summaries] == ["batch", "interactive", OVERALL]
    assert [s.requests for s in summaries] == [2, 1, 3]


def test_render_summary_has_a_row_per_summary_in_milliseconds() -> None:
    """The table has one row per summary and shows latencies in ms."""
    summaries = summarize([_rec(0, e2e_s=0.25), _rec(1, lane="batch", e2e_s=0.25)])
    table = render_summary(summaries, "run")
    assert table.row_count == 3
    assert "250.0" in _render(table)


def test_compare_shows_both_runs_and_their_ratio() -> None:
    """Each lane's metrics appear for both runs with the ratio B / A."""
    a = summarize([_rec(0, e2e_s=2.0)])
    b = summarize([_rec(0, e2e_s=1.0), _rec(1, lane="batch")])
    text = _render(compare(a, b, ("fifo", "slack")))
    assert "2000.0" in text
    assert "0.50×" in text
    assert "batch" in text
