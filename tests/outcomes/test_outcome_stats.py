"""The one summary shared by the simulator and the load generator (``sluicegate.outcomes``)."""

from __future__ import annotations

import numpy as np
import pytest

from sluicegate.core.ticket import Outcome
from sluicegate.outcomes import COMPLETED, LatencyStats, OutcomeStats, RequestOutcome


def outcome(
    result: str = COMPLETED,
    *,
    arrival: float = 0.0,
    admit: float | None = None,
    first_token: float | None = None,
    finish: float | None = 1.0,
    deadline: float | None = 2.0,
    generated: int = 5,
) -> RequestOutcome:
    """A hand-made outcome; only the fields the summary reads vary."""
    return RequestOutcome(
        index=0, tenant="t", lane="main", priority=2, outcome=result, arrival_s=arrival,
        admit_s=admit, first_token_s=first_token, finish_s=finish, deadline_s=deadline,
        prompt_tokens=10, output_tokens=generated, generated_tokens=generated, replica=None,
        requeues=0,
    )  # fmt: skip


# ---------------------------------------------------------------- percentiles


def test_percentiles_use_numpy_linear_interpolation() -> None:
    """p50/p90/p99/p99.9 of 1…100 are the type-7 values 50.5, 90.1, 99.01, 99.901."""
    stats = LatencyStats.of([float(x) for x in range(1, 101)])
    assert (stats.p50, stats.p90) == pytest.approx((50.5, 90.1))
    assert (stats.p99, stats.p999) == pytest.approx((99.01, 99.901))
    assert stats.mean == pytest.approx(50.5)
    assert stats.count == 100


def test_no_samples_give_no_figures() -> None:
    """No samples: count 0 and every statistic ``None``."""
    assert LatencyStats.of([]) == LatencyStats(0, None, None, None, None, None)


def test_one_sample_is_every_percentile() -> None:
    """A single value is the mean and every percentile."""
    assert LatencyStats.of([0.25]) == LatencyStats(1, 0.25, 0.25, 0.25, 0.25, 0.25)


def test_two_samples_interpolate_between_them() -> None:
    """Of {1, 3}, the q-th percentile is 1 + 2q: 2, 2.8, 2.98, 2.998."""
    stats = LatencyStats.of([3.0, 1.0])
    assert (stats.p50, stats.p90, stats.p99, stats.p999) == pytest.approx((2.0, 2.8, 2.98, 2.998))


def test_p999_of_few_samples_lies_between_the_top_two() -> None:
    """Of 1…10, p99.9 sits at rank 9 × 0.999 = 8.991: 9 + 0.991 × (10 − 9)."""
    stats = LatencyStats.of([float(x) for x in range(10, 0, -1)])
    assert stats.p999 == pytest.approx(9.991)
    assert stats.p99 == pytest.approx(9.91)


def test_percentiles_match_numpy_on_random_samples() -> None:
    """Any order, any spread: numpy's linear percentiles of the same values."""
    values = np.random.default_rng(3).exponential(1.0, 257)
    stats = LatencyStats.of(values.tolist())
    expected = np.percentile(values, [50, 90, 99, 99.9])
    assert [stats.p50, stats.p90, stats.p99, stats.p999] == pytest.approx(expected, rel=1e-12)


# ---------------------------------------------------------------- one request


def test_completed_is_the_core_outcome() -> None:
    """``COMPLETED`` is the scheduler's own outcome label, which the simulator records."""
    assert Outcome.COMPLETED.value == COMPLETED


@pytest.mark.parametrize(
    ("record", "good"),
    [
        (outcome(finish=2.0, deadline=2.0), True),  # exactly on the deadline
        (outcome(finish=2.0 + 1e-9, deadline=2.0), False),
        (outcome(finish=50.0, deadline=None), True),  # no deadline: completing is enough
        (outcome("rejected_queue_full", finish=0.0), False),
        (outcome("preempted", finish=1.0), False),
        (outcome("expired", finish=1.0, deadline=None), False),
        (outcome(finish=None), False),
    ],
    ids=["on-deadline", "late", "no-deadline", "rejected", "preempted", "expired", "unfinished"],
)
def test_good_means_completed_by_the_deadline(record: RequestOutcome, good: bool) -> None:
    """Good = outcome ``completed`` and finish ≤ deadline; nothing else is good."""
    assert record.good is good


def test_latencies_are_taken_only_where_they_exist() -> None:
    """Queue wait needs an admission; TTFT and end-to-end need a completion."""
    done = outcome(arrival=1.0, admit=1.5, first_token=2.0, finish=4.0)
    assert (done.queue_wait_s, done.ttft_s, done.e2e_s) == (0.5, 1.0, 3.0)
    cut = outcome("preempted", arrival=1.0, admit=1.5, first_token=2.0, finish=4.0)
    assert (cut.queue_wait_s, cut.ttft_s, cut.e2e_s) == (0.5, None, None)
    refused = outcome("rejected_rate_limit", arrival=1.0, finish=1.0)
    assert (refused.queue_wait_s, refused.ttft_s, refused.e2e_s) == (None, None, None)


# ---------------------------------------------------------------- a group


def test_a_group_by_hand() -> None:
    """Five requests over 10 s, one of them good.

    good: completed by its deadline (A); B completed late; C, D and E did not complete
    but count in the denominator: attainment 1/5. Goodput 1/10 req/s and 10/10 tok/s;
    throughput counts D's partial output: (10 + 20 + 7) / 10.
    """
    records = [
        outcome(arrival=0.0, admit=0.5, first_token=1.0, finish=2.0, deadline=3.0, generated=10),
        outcome(arrival=1.0, admit=1.0, first_token=2.0, finish=5.0, deadline=4.0, generated=20),
        outcome("rejected_queue_full", arrival=2.0, finish=2.0, deadline=5.0, generated=0),
        outcome("preempted", arrival=3.0, admit=3.5, finish=6.0, deadline=10.0, generated=7),
        outcome("expired", arrival=4.0, finish=9.0, deadline=6.0, generated=0),
    ]
    stats = OutcomeStats.of(records, 10.0)
    assert stats.requests == 5
    assert list(stats.outcomes.items()) == [
        ("completed", 2), ("expired", 1), ("preempted", 1), ("rejected_queue_full", 1),
    ]  # fmt: skip
    assert stats.completed == 2
    assert stats.slo_attainment == pytest.approx(0.2)
    assert stats.goodput_rps == pytest.approx(0.1)
    assert stats.goodput_tokens_per_s == pytest.approx(1.0)
    assert stats.throughput_tokens_per_s == pytest.approx(3.7)
    assert (stats.queue_wait.count, stats.queue_wait.mean) == (3, pytest.approx(1 / 3))
    assert (stats.ttft.count, stats.ttft.p50) == (2, pytest.approx(1.0))
    assert (stats.e2e.count, stats.e2e.mean, stats.e2e.p99) == (2, 3.0, pytest.approx(3.98))


def test_requests_without_a_deadline_are_good_when_they_complete() -> None:
    """One completed without a deadline (good), one late, one rejected: attainment 1/3."""
    records = [
        outcome(finish=9.0, deadline=None),
        outcome(finish=3.0, deadline=2.0),
        outcome("rejected_queue_full", finish=0.0, generated=0),
    ]
    stats = OutcomeStats.of(records, 2.0)
    assert stats.slo_attainment == pytest.approx(1 / 3)
    assert stats.goodput_rps == pytest.approx(0.5)


def test_no_deadline_at_all_gives_no_attainment_but_goodput() -> None:
    """Without any deadline there is no SLO to attain; completions are still goodput."""
    records = [outcome(deadline=None), outcome("upstream_error", deadline=None, generated=0)]
    stats = OutcomeStats.of(records, 4.0)
    assert stats.slo_attainment is None
    assert stats.goodput_rps == pytest.approx(0.25)


def test_an_empty_group_has_no_attainment_and_zero_rates() -> None:
    """No requests: attainment ``None``, every rate 0, every latency empty."""
    stats = OutcomeStats.of([], 1.0)
    assert (stats.requests, stats.completed, stats.slo_attainment) == (0, 0, None)
    assert (stats.goodput_rps, stats.throughput_tokens_per_s) == (0.0, 0.0)
    assert stats.e2e == LatencyStats.of([])
