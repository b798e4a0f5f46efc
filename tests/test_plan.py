"""Tests for the queueing-theory capacity planner (DESIGN §12, §15)."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from rich.console import Console

from sluicegate.planner.presentation import plot_wait_vs_utilization, render_plan, wait_curve
from sluicegate.planner.queueing import (
    ASSUMPTIONS,
    PlanInfeasibleError,
    PlanInput,
    allen_cunneen_wait,
    erlang_c,
    mmc_wait,
    plan_capacity,
)


def _erlang_c_direct(c: int, a: float) -> float:
    """Textbook formula with factorials, independent of the implementation."""
    rho = a / c
    top = a**c / math.factorial(c) / (1.0 - rho)
    return top / (math.fsum(a**k / math.factorial(k) for k in range(c)) + top)


def _erlang_c_log_space(c: int, a: float) -> float:
    """Same formula evaluated in log space with lgamma, usable for huge c."""
    logs = [k * math.log(a) - math.lgamma(k + 1) for k in range(c)]
    log_top = c * math.log(a) - math.lgamma(c + 1) - math.log1p(-a / c)
    peak = max([*logs, log_top])
    denom = math.fsum(math.exp(x - peak) for x in logs) + math.exp(log_top - peak)
    return math.exp(log_top - peak) / denom


def _plan_input(**overrides: float) -> PlanInput:
    fields: dict[str, float] = {
        "arrival_rate": 3.0,
        "mean_service_s": 2.0,
        "cv_service": 2.0,
        "slots_per_replica": 2,
        "p99_wait_slo_s": 1.0,
    }
    fields.update(overrides)
    return PlanInput(
        arrival_rate=fields["arrival_rate"],
        mean_service_s=fields["mean_service_s"],
        cv_service=fields["cv_service"],
        slots_per_replica=int(fields["slots_per_replica"]),
        p99_wait_slo_s=fields["p99_wait_slo_s"],
        cv_arrival=fields.get("cv_arrival", 1.0),
        max_replicas=int(fields.get("max_replicas", 1000)),
    )


def test_mm2_matches_published_values() -> None:
    """M/M/2 with λ=1.8, μ=1 has C = 0.852632 and W_q = 4.263158 (DESIGN §15)."""
    stats = mmc_wait(1.8, 1.0, 2)
    assert stats.p_wait == pytest.approx(0.852632, abs=1e-6)
    assert stats.mean_wait_s == pytest.approx(4.263158, abs=1e-6)


def test_mm8_matches_published_values() -> None:
    """M/M/8 with λ=6, μ=1 has C = 0.356981 and W_q = 0.178491 (DESIGN §15)."""
    stats = mmc_wait(6.0, 1.0, 8)
    assert stats.p_wait == pytest.approx(0.356981, abs=1e-6)
    assert stats.mean_wait_s == pytest.approx(0.178491, abs=1e-6)


@settings(max_examples=200, deadline=None)
@given(c=st.integers(min_value=1, max_value=50), rho=st.floats(min_value=0.001, max_value=0.999))
def test_erlang_c_matches_factorial_formula(c: int, rho: float) -> None:
    """The stable Erlang B recursion equals the factorial formula for c ≤ 50 at any load."""
    a = rho * c
    assert erlang_c(c, a) == pytest.approx(_erlang_c_direct(c, a), rel=1e-9, abs=1e-300)


def test_erlang_c_single_server_is_utilization() -> None:
    """For M/M/1 the probability of waiting is ρ."""
    assert erlang_c(1, 0.7) == pytest.approx(0.7, rel=1e-12)


def test_mm1_wait_is_rho_over_mu_minus_lambda() -> None:
    """c=1 reduces to M/M/1: W_q = ρ/(μ−λ) and L_q = ρ²/(1−ρ)."""
    lam, mu = 0.75, 1.25
    rho = lam / mu
    stats = mmc_wait(lam, mu, 1)
    assert stats.mean_wait_s == pytest.approx(rho / (mu - lam), rel=1e-12)
    assert stats.mean_queue_len == pytest.approx(rho**2 / (1.0 - rho), rel=1e-12)


def test_mmc_p99_solves_exponential_tail() -> None:
    """The p99 wait t satisfies C·e^{−(cμ−λ)t} = 0.01."""
    lam, mu, c = 6.0, 1.0, 8
    stats = mmc_wait(lam, mu, c)
    tail = stats.p_wait * math.exp(-(c * mu - lam) * stats.p99_wait_s)
    assert tail == pytest.approx(0.01, rel=1e-9)


def test_p99_is_zero_when_few_requests_wait() -> None:
    """When P(wait) ≤ 1 %, at least 99 % of requests never wait, so p99 wait is 0."""
    stats = mmc_wait(1.0, 1.0, 8)
    assert stats.p_wait <= 0.01
    assert stats.p99_wait_s == 0.0


def test_wait_quantile_is_monotone() -> None:
    """Higher quantiles of the wait are never smaller."""
    stats = mmc_wait(1.8, 1.0, 2)
    quantiles = [stats.wait_quantile(q) for q in (0.0, 0.5, 0.9, 0.99, 0.999)]
    assert quantiles == sorted(quantiles)
    assert quantiles[-1] > quantiles[-2]


@pytest.mark.parametrize(("c", "a"), [(2, 2.0), (2, 3.0), (8, 8.0)])
def test_erlang_c_rejects_unstable_load(c: int, a: float) -> None:
    """ρ = a/c ≥ 1 is an unstable queue and raises ValueError naming rho."""
    with pytest.raises(ValueError, match="rho"):
        erlang_c(c, a)


def test_mmc_wait_rejects_unstable_load() -> None:
    """mmc_wait raises when λ ≥ cμ."""
    with pytest.raises(ValueError, match="unstable"):
        mmc_wait(2.0, 1.0, 2)


@pytest.mark.parametrize(("c", "a"), [(0, 0.5), (-1, 0.5), (2, -0.1), (2, math.nan)])
def test_erlang_c_rejects_invalid_arguments(c: int, a: float) -> None:
    """Non-positive server counts and negative or NaN loads are rejected."""
    with pytest.raises(ValueError, match=">="):
        erlang_c(c, a)


@pytest.mark.parametrize(("c", "rho"), [(5000, 0.95), (10_000, 0.99), (10_000, 0.5)])
def test_erlang_c_large_c_matches_log_space(c: int, rho: float) -> None:
    """Large c works without overflow and matches an lgamma log-space evaluation."""
    a = rho * c
    value = erlang_c(c, a)
    assert math.isfinite(value)
    assert value == pytest.approx(_erlang_c_log_space(c, a), rel=1e-8, abs=1e-300)


@pytest.mark.parametrize(("c", "lam"), [(1, 0.6), (2, 1.8), (8, 6.0), (40, 35.0)])
def test_allen_cunneen_equals_mmc_for_exponential(c: int, lam: float) -> None:
    """With c_a = c_s = 1, Allen–Cunneen is exactly M/M/c."""
    assert allen_cunneen_wait(lam, 1.0, 1.0, 1.0, c) == mmc_wait(lam, 1.0, c)


def test_allen_cunneen_single_server_is_pollaczek_khinchine() -> None:
    """c=1, c_a=1 gives the M/G/1 mean wait λ·E[S²]/(2(1−ρ)) (Kingman is exact here)."""
    lam, mean_s, cv_s = 0.4, 2.0, 1.5
    second_moment = (1.0 + cv_s**2) * mean_s**2
    expected = lam * second_moment / (2.0 * (1.0 - lam * mean_s))
    assert allen_cunneen_wait(lam, mean_s, 1.0, cv_s, 1).mean_wait_s == pytest.approx(expected)


def test_allen_cunneen_scales_mean_and_tail_by_variability() -> None:
    """Mean wait and p99 (above zero) scale by (c_a² + c_s²)/2 relative to M/M/c."""
    base = mmc_wait(1.8, 1.0, 2)
    scaled = allen_cunneen_wait(1.8, 1.0, 0.5, 2.0, 2)
    factor = (0.5**2 + 2.0**2) / 2.0
    assert scaled.mean_wait_s == pytest.approx(factor * base.mean_wait_s)
    assert scaled.p99_wait_s == pytest.approx(factor * base.p99_wait_s)
    assert scaled.p_wait == base.p_wait


def test_deterministic_traffic_never_waits() -> None:
    """With c_a = c_s = 0 (D/D/c) the Allen–Cunneen wait is zero."""
    stats = allen_cunneen_wait(1.8, 1.0, 0.0, 0.0, 2)
    assert stats.mean_wait_s == 0.0
    assert stats.wait_quantile(0.999) == 0.0


@settings(max_examples=60, deadline=None)
@given(
    lam=st.floats(min_value=0.1, max_value=50.0),
    mean_s=st.floats(min_value=0.05, max_value=20.0),
    cv_s=st.floats(min_value=0.0, max_value=4.0),
    cv_a=st.floats(min_value=0.0, max_value=3.0),
    slots=st.integers(min_value=1, max_value=32),
    slo=st.floats(min_value=0.01, max_value=30.0),
)
def test_planner_picks_fewest_replicas_meeting_slo(
    lam: float, mean_s: float, cv_s: float, cv_a: float, slots: int, slo: float
) -> None:
    """The chosen count meets the p99 SLO with ρ < 1; one replica fewer does not."""
    inp = PlanInput(
        arrival_rate=lam,
        mean_service_s=mean_s,
        cv_service=cv_s,
        cv_arrival=cv_a,
        slots_per_replica=slots,
        p99_wait_slo_s=slo,
        max_replicas=100_000,
    )
    result = plan_capacity(inp)
    chosen = allen_cunneen_wait(lam, mean_s, cv_a, cv_s, result.replicas * slots)
    assert chosen.utilization < 1.0
    assert chosen.p99_wait_s <= slo
    fewer = (result.replicas - 1) * slots
    if fewer == 0 or lam * mean_s >= fewer:
        return
    assert allen_cunneen_wait(lam, mean_s, cv_a, cv_s, fewer).p99_wait_s > slo


def test_planner_reports_mmc_at_the_same_point() -> None:
    """The plan's M/M/c numbers are those of the chosen server count."""
    result = plan_capacity(_plan_input())
    assert result.mm == mmc_wait(3.0, 0.5, result.servers)
    assert result.servers == result.replicas * 2


def test_planner_needs_more_than_stability_when_slo_is_tight() -> None:
    """A tight SLO needs more replicas than merely keeping up (ρ < 1) does."""
    result = plan_capacity(_plan_input(p99_wait_slo_s=0.05))
    assert result.stable_replicas == 4
    assert result.replicas > result.stable_replicas


def test_planner_recommends_queue_cap_from_drain_rate() -> None:
    """max_queue = ceil(c·μ·SLO): the backlog the slots drain within the SLO."""
    result = plan_capacity(_plan_input())
    assert result.max_queue == math.ceil(result.servers / 2.0 * 1.0)


def test_planner_recommends_timeout_beyond_slo() -> None:
    """The queue timeout exceeds the SLO and cuts under 1 % of requests by the model."""
    result = plan_capacity(_plan_input())
    assert result.queue_timeout_s > result.input.p99_wait_slo_s
    assert result.timeout_drop_fraction == pytest.approx(
        result.gg.p_wait_exceeds(result.queue_timeout_s)
    )
    assert result.timeout_drop_fraction < 0.01


def test_planner_raises_when_search_limit_too_small() -> None:
    """If max_replicas cannot meet the SLO, PlanInfeasibleError says so."""
    with pytest.raises(PlanInfeasibleError, match="max_replicas"):
        plan_capacity(_plan_input(max_replicas=3))


@pytest.mark.parametrize(
    "overrides",
    [
        {"arrival_rate": 0.0},
        {"mean_service_s": -1.0},
        {"cv_service": -0.5},
        {"slots_per_replica": 0},
        {"p99_wait_slo_s": 0.0},
        {"max_replicas": 0},
        {"arrival_rate": math.inf},
    ],
)
def test_plan_input_validates_ranges(overrides: dict[str, float]) -> None:
    """Out-of-range inputs fail at construction with the allowed range in the message."""
    with pytest.raises(ValueError, match=">"):
        _plan_input(**overrides)


def test_render_plan_shows_operating_point_and_assumptions() -> None:
    """The rendered table names the replica count, queue cap and assumptions."""
    result = plan_capacity(_plan_input())
    console = Console(width=200, force_terminal=False)
    with console.capture() as capture:
        console.print(render_plan(result))
    words = " ".join(re.sub("[\u2500-\u257f]", " ", capture.get()).split())
    assert f"replicas {result.replicas} {result.replicas}" in words
    assert f"recommended max_queue {result.max_queue}" in words
    assert " ".join(ASSUMPTIONS.split()) in words


def test_wait_curve_rises_with_utilization() -> None:
    """At fixed servers the p99 wait never falls as utilization rises."""
    rhos, waits = wait_curve(plan_capacity(_plan_input()))
    assert rhos == sorted(rhos)
    assert waits == sorted(waits)
    assert waits[-1] > 0.0


def test_plot_writes_valid_png(tmp_path: Path) -> None:
    """The plot is written as a non-empty file that starts with the PNG signature."""
    path = tmp_path / "wait.png"
    written = plot_wait_vs_utilization(plan_capacity(_plan_input()), path)
    data = written.read_bytes()
    assert written == path
    assert len(data) > 1000
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
