"""Tests for the warm-buffer planner: the burst model, its invariants and the search."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sluicegate.planner.backlog import backlog_exceed_probability, backlog_quantile
from sluicegate.planner.queueing import (
    PlanInfeasibleError,
    PlanInput,
    allen_cunneen_wait,
    plan_capacity,
)
from sluicegate.planner.warm_buffer import (
    DEFAULT_BURST_FACTOR,
    DEFAULT_DETECT_S,
    DEFAULT_SCALE_UP_S,
    Burst,
    burst_wait,
    max_burst_factor,
    plan_warm_buffer,
    rule_of_thumb_warm,
)
from tests.test_plan_keda import README_INPUT


def _normal_sf(z: float) -> float:
    return 0.5 * math.erfc(z / math.sqrt(2.0))


def _mmc_backlog_p99(lam: float, mu: float, c: int, horizon_s: float, paths: int = 4000) -> float:
    """p99 of the number waiting at T in M/M/c started empty, simulated by uniformization."""
    rng = np.random.default_rng(1)
    total = lam + c * mu
    events = rng.poisson(total * horizon_s, size=paths)
    in_system = np.zeros(paths, dtype=np.int64)
    for step in range(int(events.max())):
        live = step < events
        u = rng.random(paths) * total
        arrival = u < lam
        departure = ~arrival & (u < lam + np.minimum(in_system, c) * mu)
        in_system += (live & arrival).astype(np.int64) - (live & departure).astype(np.int64)
    return float(np.quantile(np.maximum(in_system - c, 0), 0.99))


@pytest.mark.parametrize("x", [0.5, 3.0, 12.0])
def test_backlog_tail_without_drift_is_reflection_principle(x: float) -> None:
    """θ = 0: P(sup_{u≤T} σB_u > x) = 2·Φ̄(x/(σ√T))."""
    variance, horizon = 2.0, 9.0
    expected = 2.0 * _normal_sf(x / math.sqrt(variance * horizon))
    assert backlog_exceed_probability(x, 0.0, variance, horizon) == pytest.approx(expected)


@pytest.mark.parametrize("x", [1.0, 5.0, 20.0])
def test_backlog_tail_tends_to_stationary_exponential(x: float) -> None:
    """θ < 0 and T → ∞: P(Q > x) = e^{2θx/σ²}, the reflected Brownian motion's stationary law."""
    drift, variance = -1.0, 2.0
    assert backlog_exceed_probability(x, drift, variance, 1e7) == pytest.approx(
        math.exp(2.0 * drift * x / variance), rel=1e-9
    )


def test_backlog_without_noise_is_the_fluid_backlog() -> None:
    """σ² = 0: the backlog is exactly max(θ, 0)·T, a step in the tail."""
    assert backlog_quantile(0.99, 2.5, 0.0, 40.0) == 100.0
    assert backlog_quantile(0.99, -2.5, 0.0, 40.0) == 0.0
    assert backlog_exceed_probability(99.9, 2.5, 0.0, 40.0) == 1.0
    assert backlog_exceed_probability(100.0, 2.5, 0.0, 40.0) == 0.0


def test_backlog_quantile_solves_the_tail() -> None:
    """The p99 backlog x satisfies P(Q_T > x) = 0.01, and lies above the fluid level."""
    x = backlog_quantile(0.99, 3.0, 5.0, 100.0)
    assert backlog_exceed_probability(x, 3.0, 5.0, 100.0) == pytest.approx(0.01, rel=1e-6)
    assert x > 300.0


def test_backlog_far_past_capacity_neither_overflows_nor_loses_the_fluid_term() -> None:
    """A huge drift (b ≫ 30, e^{2θx/σ²} beyond any float) still gives θT plus a finite spread."""
    x = backlog_quantile(0.99, 1e4, 1.0, 1e4)
    assert math.isfinite(x)
    assert 1e8 < x < 1e8 + 1e3


@pytest.mark.parametrize("variance", [5e-324, 1e-300, 1e-20])
def test_backlog_quantile_with_negligible_noise_is_the_fluid_backlog(variance: float) -> None:
    """Noise below the float resolution of θT gives θT (it once looped forever)."""
    assert backlog_quantile(0.99, 40.0, variance, 150.0) == pytest.approx(6000.0, rel=1e-9)


@settings(max_examples=80, deadline=None)
@given(
    drift=st.floats(min_value=-50.0, max_value=50.0),
    variance=st.floats(min_value=0.01, max_value=100.0),
    horizon=st.floats(min_value=0.1, max_value=1000.0),
    x1=st.floats(min_value=0.0, max_value=1e4),
    x2=st.floats(min_value=0.0, max_value=1e4),
)
def test_backlog_tail_is_a_survival_function(
    drift: float, variance: float, horizon: float, x1: float, x2: float
) -> None:
    """P(Q_T > x) is in [0, 1], equals 1 at x = 0 and never rises with x."""
    lo, hi = sorted((x1, x2))
    p_lo = backlog_exceed_probability(lo, drift, variance, horizon)
    p_hi = backlog_exceed_probability(hi, drift, variance, horizon)
    assert 0.0 <= p_hi <= p_lo + 1e-12 <= 1.0 + 1e-12
    assert backlog_exceed_probability(0.0, drift, variance, horizon) == pytest.approx(1.0)


@pytest.mark.parametrize(("lam", "c"), [(9.0, 10), (10.0, 10), (12.5, 10), (20.0, 10)])
def test_backlog_diffusion_matches_simulated_mmc(lam: float, c: int) -> None:
    """The p99 backlog after 100 s from empty agrees with an M/M/c simulation to 10 %.

    The diffusion may overstate (it ignores that idle servers do not drain) but
    not understate by more than the simulation's noise.
    """
    simulated = _mmc_backlog_p99(lam, 1.0, c, 100.0)
    estimated = backlog_quantile(0.99, lam - c, 2.0 * lam, 100.0)
    assert estimated == pytest.approx(simulated, rel=0.1)
    assert estimated >= 0.98 * simulated


def test_deterministic_burst_wait_is_backlog_over_drain_rate() -> None:
    """c_a = c_s = 0: the wait at the window's end is (K·λ − cμ)·T/(cμ), the fluid formula."""
    inp = replace(README_INPUT, cv_service=0.0, cv_arrival=0.0)
    burst = Burst(factor=2.0, scale_up_s=90.0, detect_s=60.0)
    wait = burst_wait(inp, burst, 3)
    drain = 3 * 32 / 4.0
    assert wait.burst_rate == 40.0
    assert wait.fluid_backlog == pytest.approx((40.0 - drain) * 150.0)
    assert wait.p99_wait_s == pytest.approx((40.0 - drain) * 150.0 / drain)
    assert wait.stationary_p99_s == math.inf
    assert wait.basis == "transient"


def test_stable_burst_uses_allen_cunneen_when_smaller() -> None:
    """Below saturation with many slots the stationary Allen–Cunneen p99 is the estimate."""
    wait = burst_wait(README_INPUT, Burst(factor=2.0), 6)
    stationary = allen_cunneen_wait(40.0, 4.0, 1.0, 1.5, 192).p99_wait_s
    assert wait.stationary_p99_s == stationary
    assert wait.p99_wait_s == stationary
    assert wait.basis == "stationary"


def test_readme_example_plan() -> None:
    """λ = 20, E[S] = 4 s, 32 slots, SLO 2 s, ×2 for 150 s: 3 base + 3 warm; 2-per-8 gives 1."""
    warm = plan_warm_buffer(plan_capacity(README_INPUT), Burst())
    assert (warm.base_replicas, warm.warm, warm.min_replicas) == (3, 3, 6)
    assert warm.rule_of_thumb_warm == 1
    assert warm.rule_of_thumb.p99_wait_s > 2.0
    assert warm.burst_replicas == 6
    assert [row.replicas for row in warm.rows] == [3, 4, 5, 6]
    assert 1.0 < warm.rule_of_thumb_max_factor < 2.0


def test_defaults_are_the_documented_ones() -> None:
    """The burst defaults: ×2, 90 s scale-up, 60 s to detect; the window is their sum."""
    burst = Burst()
    assert (burst.factor, burst.scale_up_s, burst.detect_s) == (2.0, 90.0, 60.0)
    assert (DEFAULT_BURST_FACTOR, DEFAULT_SCALE_UP_S, DEFAULT_DETECT_S) == (2.0, 90.0, 60.0)
    assert burst.window_s == 150.0


@pytest.mark.parametrize(("active", "idle"), [(1, 1), (4, 1), (8, 2), (9, 3), (16, 4), (17, 5)])
def test_rule_of_thumb_is_two_per_eight_rounded_up(active: int, idle: int) -> None:
    """⌈active · 2/8⌉."""
    assert rule_of_thumb_warm(active) == idle


def test_max_burst_factor_is_the_edge() -> None:
    """At the returned K the replicas meet the SLO; 0.1 % above it they do not."""
    burst = Burst()
    k = max_burst_factor(README_INPUT, burst, 4)
    assert burst_wait(README_INPUT, replace(burst, factor=k), 4).p99_wait_s <= 2.0
    assert burst_wait(README_INPUT, replace(burst, factor=k * 1.001), 4).p99_wait_s > 2.0


def test_max_burst_factor_is_zero_when_even_the_base_rate_misses() -> None:
    """Replicas that miss the SLO at λ absorb no burst."""
    assert max_burst_factor(README_INPUT, Burst(), 2) == 0.0


def test_infeasible_burst_names_max_replicas() -> None:
    """A burst that needs more than max_replicas up is a PlanInfeasibleError saying so."""
    capacity = plan_capacity(replace(README_INPUT, max_replicas=4))
    with pytest.raises(PlanInfeasibleError, match="max_replicas = 4"):
        plan_warm_buffer(capacity, Burst(factor=3.0))


@pytest.mark.parametrize(
    "kwargs",
    [{"factor": 0.9}, {"factor": math.nan}, {"scale_up_s": -1.0}, {"detect_s": math.inf}],
)
def test_burst_validates_ranges(kwargs: dict[str, float]) -> None:
    """K < 1, non-finite or negative times are refused with the allowed range."""
    with pytest.raises(ValueError, match=">= "):
        Burst(**kwargs)


inputs = st.builds(
    PlanInput,
    arrival_rate=st.floats(min_value=0.05, max_value=30.0),
    mean_service_s=st.floats(min_value=0.05, max_value=20.0),
    cv_service=st.floats(min_value=0.0, max_value=3.0),
    slots_per_replica=st.integers(min_value=1, max_value=16),
    p99_wait_slo_s=st.floats(min_value=0.05, max_value=30.0),
    cv_arrival=st.floats(min_value=0.0, max_value=2.0),
    max_replicas=st.just(100_000),
)
bursts = st.builds(
    Burst,
    factor=st.floats(min_value=1.0, max_value=4.0),
    scale_up_s=st.floats(min_value=0.0, max_value=300.0),
    detect_s=st.floats(min_value=0.0, max_value=120.0),
)


@settings(max_examples=60, deadline=None)
@given(inp=inputs, burst=bursts, extra=st.integers(min_value=0, max_value=6))
def test_more_warm_is_never_worse(inp: PlanInput, burst: Burst, extra: int) -> None:
    """The window p99 never rises with one more replica up."""
    base = plan_capacity(inp).replicas
    fewer = burst_wait(inp, burst, base + extra)
    more = burst_wait(inp, burst, base + extra + 1)
    assert more.p99_wait_s <= fewer.p99_wait_s * (1.0 + 1e-9)


@settings(max_examples=40, deadline=None)
@given(inp=inputs, burst=bursts, bigger=st.floats(min_value=1.0, max_value=2.0))
def test_larger_burst_never_needs_fewer(inp: PlanInput, burst: Burst, bigger: float) -> None:
    """A larger burst factor, or a longer wait for new capacity, never needs fewer warm."""
    capacity = plan_capacity(inp)
    planned = plan_warm_buffer(capacity, burst).warm
    larger = replace(burst, factor=burst.factor * bigger)
    slower = replace(burst, scale_up_s=burst.scale_up_s * bigger + 1.0)
    assert plan_warm_buffer(capacity, larger).warm >= planned
    assert plan_warm_buffer(capacity, slower).warm >= planned


@settings(max_examples=40, deadline=None)
@given(inp=inputs, burst=bursts)
def test_warm_is_the_fewest_meeting_the_slo(inp: PlanInput, burst: Burst) -> None:
    """base + warm meets the SLO in the window; base + warm − 1 does not."""
    warm = plan_warm_buffer(plan_capacity(inp), burst)
    assert warm.planned.replicas == warm.min_replicas
    assert warm.planned.p99_wait_s <= inp.p99_wait_slo_s
    if warm.warm > 0:
        assert burst_wait(inp, burst, warm.min_replicas - 1).p99_wait_s > inp.p99_wait_slo_s


@settings(max_examples=40, deadline=None)
@given(inp=inputs, burst=bursts)
def test_no_burst_needs_no_warm(inp: PlanInput, burst: Burst) -> None:
    """K = 1: the base replicas already meet the SLO, so warm is 0."""
    assert plan_warm_buffer(plan_capacity(inp), replace(burst, factor=1.0)).warm == 0
