"""Tests for synthetic workloads and workload transforms (DESIGN §12)."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from sluicegate.outcomes import WorkloadRequest
from sluicegate.sim.workloads import (
    LengthDist,
    MaxTokensPolicy,
    gamma_bursts,
    head,
    merge,
    on_off,
    poisson,
    resolve_max_tokens,
    scale_rate,
    shift,
    window,
)

SMALL = LengthDist.constant(8)


def _gaps(requests: list[WorkloadRequest]) -> np.ndarray:
    return np.diff(np.array([0.0] + [r.arrival_s for r in requests]))


def _cv(values: np.ndarray) -> float:
    return float(np.std(values) / np.mean(values))


def _arrivals(requests: list[WorkloadRequest]) -> list[float]:
    return [r.arrival_s for r in requests]


def test_poisson_mean_rate() -> None:
    """A long seeded Poisson run has a mean rate within 2 % of the requested rate."""
    requests = poisson(50.0, 2000.0, seed=1, prompt=SMALL, output=SMALL)
    assert len(requests) / 2000.0 == pytest.approx(50.0, rel=0.02)


def test_poisson_interarrival_cv_is_one() -> None:
    """Poisson inter-arrival times are exponential: coefficient of variation ≈ 1."""
    requests = poisson(50.0, 2000.0, seed=2, prompt=SMALL, output=SMALL)
    assert _cv(_gaps(requests)) == pytest.approx(1.0, abs=0.03)


@pytest.mark.parametrize("cv", [0.5, 2.0, 4.0])
def test_gamma_bursts_cv(cv: float) -> None:
    """Gamma inter-arrival times have the requested CV (within 10 %) and mean rate."""
    requests = gamma_bursts(20.0, cv, 5000.0, seed=3, prompt=SMALL, output=SMALL)
    assert _cv(_gaps(requests)) == pytest.approx(cv, rel=0.10)
    assert len(requests) / 5000.0 == pytest.approx(20.0, rel=0.05)


GENERATORS: dict[str, Callable[[int], list[WorkloadRequest]]] = {
    "poisson": lambda seed: poisson(5.0, 100.0, seed=seed),
    "gamma": lambda seed: gamma_bursts(5.0, 3.0, 100.0, seed=seed),
    "on_off": lambda seed: on_off(10.0, 5.0, 5.0, 100.0, seed=seed, tenant="noisy"),
}


@pytest.mark.parametrize("name", sorted(GENERATORS))
def test_generator_is_deterministic_for_a_seed(name: str) -> None:
    """The same seed gives the same workload; another seed gives a different one."""
    make = GENERATORS[name]
    assert make(7) == make(7)
    assert make(7) != make(8)


@pytest.mark.parametrize("name", sorted(GENERATORS))
def test_generator_arrivals_sorted_within_duration(name: str) -> None:
    """Arrivals are sorted and lie in [0, duration)."""
    arrivals = _arrivals(GENERATORS[name](11))
    assert arrivals == sorted(arrivals)
    assert arrivals[0] >= 0.0
    assert arrivals[-1] < 100.0


def test_length_distribution_does_not_change_arrivals() -> None:
    """Arrivals and lengths use separate streams: new lengths, same arrival times."""
    a = poisson(5.0, 100.0, seed=4)
    b = poisson(5.0, 100.0, seed=4, output=LengthDist.exponential(50.0))
    assert _arrivals(a) == _arrivals(b)
    assert [r.output_tokens for r in a] != [r.output_tokens for r in b]


def test_default_max_tokens_is_next_power_of_two() -> None:
    """By default max_tokens is the smallest power of two >= the output length."""
    for r in poisson(20.0, 50.0, seed=5):
        assert r.max_tokens & (r.max_tokens - 1) == 0
        assert r.output_tokens <= r.max_tokens < 2 * r.output_tokens or r.max_tokens == 1


def test_on_off_silent_when_off() -> None:
    """An on/off tenant sends only during on periods, at the on rate there."""
    requests = on_off(40.0, 2.0, 8.0, 2000.0, seed=6, tenant="noisy", lane="batch")
    phases = np.mod(_arrivals(requests), 10.0)
    assert np.all(phases < 2.0)
    assert len(requests) / (200 * 2.0) == pytest.approx(40.0, rel=0.03)
    assert {(r.tenant, r.lane) for r in requests} == {("noisy", "batch")}


def test_merge_is_sorted_and_keeps_everything() -> None:
    """merge interleaves sorted workloads into one sorted list of all requests."""
    a = poisson(5.0, 50.0, seed=1, tenant="a")
    b = on_off(20.0, 1.0, 4.0, 50.0, seed=2, tenant="b")
    merged = merge(a, b)
    assert _arrivals(merged) == sorted(_arrivals(a) + _arrivals(b))
    assert sorted(merged, key=repr) == sorted(a + b, key=repr)


def test_merge_ties_keep_argument_order() -> None:
    """Requests with equal arrivals come out in the order of the workloads given."""
    first, second = WorkloadRequest(1.0, 1, 1, 1, tenant="x"), WorkloadRequest(1.0, 1, 1, 1)
    assert merge([first], [second]) == [first, second]
    assert merge([second], [first]) == [second, first]


def test_exponential_lengths_mean_and_cv() -> None:
    """ceil(Exp(mean)) has mean 1/(1-e^{-1/mean}) ≈ mean + 1/2 and CV ≈ 1."""
    draws = LengthDist.exponential(200.0).sample(np.random.default_rng(0), 200_000)
    expected_mean = 1.0 / (1.0 - math.exp(-1.0 / 200.0))
    assert float(draws.mean()) == pytest.approx(expected_mean, rel=0.01)
    assert _cv(draws.astype(np.float64)) == pytest.approx(1.0, abs=0.02)


def test_lognormal_median_and_clip() -> None:
    """Lognormal lengths have the requested median and respect the clip bounds."""
    dist = LengthDist.lognormal(100.0, 1.0, min_tokens=5, max_tokens=2000)
    draws = dist.sample(np.random.default_rng(0), 100_000)
    assert float(np.median(draws)) == pytest.approx(100.0, rel=0.03)
    assert int(draws.min()) == 5
    assert int(draws.max()) == 2000


@pytest.mark.parametrize(
    "make",
    [
        lambda: LengthDist.lognormal(0.5, 1.0),
        lambda: LengthDist.lognormal(100.0, -1.0),
        lambda: LengthDist.exponential(100.0, min_tokens=0),
        lambda: LengthDist.exponential(100.0, min_tokens=10, max_tokens=5),
    ],
)
def test_length_dist_rejects_bad_parameters(make: Callable[[], LengthDist]) -> None:
    """Out-of-range distribution parameters are rejected at construction."""
    with pytest.raises(ValueError, match="must be"):
        make()


@pytest.mark.parametrize(
    "make",
    [
        lambda: poisson(0.0, 10.0, seed=1),
        lambda: poisson(1.0, -1.0, seed=1),
        lambda: gamma_bursts(1.0, 0.0, 10.0, seed=1),
        lambda: on_off(1.0, 0.0, 1.0, 10.0, seed=1, tenant="t"),
        lambda: poisson(1.0, 10.0, seed=1, priority=6),
        lambda: poisson(1.0, 10.0, seed=1, max_tokens=0),
        lambda: poisson(1.0, 10.0, seed=1, tenant=""),
    ],
)
def test_generators_reject_bad_arguments(make: Callable[[], object]) -> None:
    """Non-positive rates, durations, CVs and periods, and bad request fields, are errors."""
    with pytest.raises(ValueError, match=r"must be|need"):
        make()


POLICIES: list[MaxTokensPolicy] = ["exact", "pow2", 1, 64, 4096]


@given(st.integers(1, 100_000), st.sampled_from(POLICIES))
def test_resolve_max_tokens_keeps_output_within_cap(output: int, policy: MaxTokensPolicy) -> None:
    """Every policy yields 1 <= output <= max_tokens, and only an int cap changes the output."""
    new_output, cap = resolve_max_tokens(output, policy)
    assert 1 <= new_output <= cap
    assert new_output == (min(output, policy) if isinstance(policy, int) else output)


def _trace() -> list[WorkloadRequest]:
    return [WorkloadRequest(float(t), 10, 5, 5) for t in (0, 1, 2, 3, 4, 5, 6, 7, 8, 9)]


def test_scale_rate_doubles_rate() -> None:
    """scale_rate(2) halves every arrival time, so the same requests arrive at twice the rate."""
    scaled = scale_rate(_trace(), 2.0)
    assert _arrivals(scaled) == [t / 2.0 for t in _arrivals(_trace())]
    assert len(scaled) / scaled[-1].arrival_s == pytest.approx(2 * 10 / 9.0)


@pytest.mark.parametrize("factor", [0.0, -1.0, math.inf, math.nan])
def test_scale_rate_rejects_bad_factor(factor: float) -> None:
    """The rate factor must be a finite positive number."""
    with pytest.raises(ValueError, match="rate factor"):
        scale_rate(_trace(), factor)


def test_window_keeps_half_open_interval_and_rebases() -> None:
    """window keeps arrivals in [start, start+duration) and subtracts start."""
    assert _arrivals(window(_trace(), 2.5, 4.5)) == [0.5, 1.5, 2.5, 3.5]
    assert _arrivals(window(_trace(), 3.0, 2.0)) == [0.0, 1.0]


def test_head_takes_first_n() -> None:
    """head returns the n earliest requests, or all when there are fewer."""
    assert _arrivals(head(_trace(), 3)) == [0.0, 1.0, 2.0]
    assert len(head(_trace(), 50)) == 10


def test_shift_delays_and_rejects_negative_result() -> None:
    """shift adds an offset to every arrival; one that makes an arrival negative is an error."""
    assert _arrivals(shift(_trace(), 5.0))[:2] == [5.0, 6.0]
    with pytest.raises(ValueError, match="negative"):
        shift(_trace(), -0.5)
