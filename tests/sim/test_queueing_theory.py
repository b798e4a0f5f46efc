"""The simulator reproduces queueing theory where it is exact: M/M/c under FCFS.

Setup: one replica of a ``batch_independent`` engine (c independent servers,
each request's service time fixed by its size) behind a scheduler with one
``fifo`` lane capped at c, so the *scheduler* queues. Arrivals are Poisson.
Service is exponential: every request generates one token, and its service
time is ``per_prefill_token_s · prompt_tokens`` with ``prompt_tokens = ⌈X⌉``,
X exponential with mean 1,000 (the ⌈·⌉ shifts the mean by half a token, which
the tests account for exactly). Putting the exponential in the prompt rather
than the output keeps it to one engine event per request instead of one per
token, so runs long enough for statistics fit the time budget.

Why three kinds of check. Mean waiting time in heavy traffic converges slowly:
over 30,000 arrivals at ρ = 0.9 its relative standard deviation is ~10%
(measured over 16 seeds), so a direct "mean within 5% of Erlang C" on a run
that fits a unit test would pass or fail by luck. Instead:

1. the simulated waits equal, arrival by arrival, those of the textbook FCFS
   c-server recursion (Kiefer–Wolfowitz) on the same arrivals and service
   times — exact, whatever the sample;
2. the simulated fraction of arrivals that wait is within 5% of Erlang C
   (relative s.d. ~1.4–2% at these lengths, so 5% is ≥ 2.5 s.d.);
3. the mean wait of that same process over 1–3 million arrivals (through the
   recursion, which (1) shows the simulator matches) is within 5% of
   ``W_q = C/(cμ − λ)`` (relative s.d. ≈ 1.3% at ρ = 0.9 over 3 million,
   measured over 10 seeds; less at lower ρ).
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass

import numpy as np
import pytest

from sluicegate.core.spec import LaneSpec, ModelSpec, SchedulerSpec
from sluicegate.engine.engine_config import EngineConfig
from sluicegate.outcomes import WorkloadRequest
from sluicegate.sim.virtual_driver import simulate

MEAN_TOKENS = 1000.0
SECONDS_PER_TOKEN = 1e-3
BASE_S = 1e-9
SERVERS = 2
RHOS = (0.5, 0.8, 0.9)


def _erlang_c(c: int, a: float) -> float:
    """P(wait) in M/M/c, the textbook formula with factorials (DESIGN §15)."""
    rho = a / c
    top = a**c / math.factorial(c) / (1.0 - rho)
    return top / (math.fsum(a**k / math.factorial(k) for k in range(c)) + top)


def _mean_service_s() -> float:
    """E[base + k·⌈X⌉] for X exponential: ⌈X⌉ is geometric with mean 1/(1 − e^(−1/m))."""
    return BASE_S + SECONDS_PER_TOKEN / (1.0 - math.exp(-1.0 / MEAN_TOKENS))


def _draw(rho: float, c: int, n: int, seed: int) -> tuple[list[float], list[int]]:
    """Poisson arrival times and ⌈exponential⌉ prompt sizes at utilization ``rho``."""
    rate = rho * c / _mean_service_s()
    rng = np.random.default_rng(seed)
    arrivals = np.cumsum(rng.exponential(1.0 / rate, n))
    tokens = np.ceil(rng.exponential(MEAN_TOKENS, n)).astype(np.int64)
    return arrivals.tolist(), [int(t) for t in tokens]


def _fcfs_waits(arrivals: list[float], service_s: list[float], c: int) -> list[float]:
    """Kiefer–Wolfowitz: each arrival starts on the earliest-free of c servers."""
    free = [0.0] * c
    waits = []
    for at, service in zip(arrivals, service_s, strict=True):
        start = max(at, heapq.heappop(free))
        waits.append(start - at)
        heapq.heappush(free, start + service)
    return waits


def _engine(c: int, *, per_prefill_token_s: float = SECONDS_PER_TOKEN) -> EngineConfig:
    return EngineConfig(
        max_num_seqs=c,
        max_num_batched_tokens=10**9,
        kv_capacity_tokens=10**9,
        base_s=BASE_S,
        per_prefill_token_s=per_prefill_token_s,
        batch_independent=True,
    )


def _spec(c: int) -> SchedulerSpec:
    lane = LaneSpec(
        name="main",
        max_concurrency=c,
        max_queue=10_000_000,
        queue_timeout_s=1e9,
        slo_ms=1e12,
        policy="fifo",
        preemptible="never",
    )
    return SchedulerSpec(models=(ModelSpec(name="m", lanes=(lane,), max_concurrency=c),))


def _simulated_waits(
    arrivals: list[float], prompts: list[int], outputs: list[int], engine: EngineConfig
) -> list[float]:
    workload = [
        WorkloadRequest(at, p, o, o, lane="main")
        for at, p, o in zip(arrivals, prompts, outputs, strict=True)
    ]
    result = simulate(_spec(engine.max_num_seqs), "m", workload, engine, 1, scrape_interval_s=1e6)
    assert all(rec.outcome == "completed" for rec in result.records)
    return [rec.admit_s - rec.arrival_s for rec in result.records if rec.admit_s is not None]


@dataclass(frozen=True)
class MmcRun:
    """One simulated M/M/c run and its reference."""

    rho: float
    simulated: list[float]
    reference: list[float]


@pytest.fixture(scope="module", params=RHOS, ids=[f"rho={r}" for r in RHOS])
def mmc_run(request: pytest.FixtureRequest) -> MmcRun:
    """30,000 (60,000 at ρ = 0.5) arrivals through the simulator, seed 0."""
    rho: float = request.param
    n = 60_000 if rho == 0.5 else 30_000
    arrivals, prompts = _draw(rho, SERVERS, n, seed=0)
    simulated = _simulated_waits(arrivals, prompts, [1] * n, _engine(SERVERS))
    service = [BASE_S + SECONDS_PER_TOKEN * p for p in prompts]
    return MmcRun(rho, simulated, _fcfs_waits(arrivals, service, SERVERS))


def test_simulated_waits_equal_the_fcfs_recursion(mmc_run: MmcRun) -> None:
    """Every request waits exactly as long as in the FCFS c-server recursion (to 1 ns)."""
    assert len(mmc_run.simulated) == len(mmc_run.reference)
    assert np.max(np.abs(np.subtract(mmc_run.simulated, mmc_run.reference))) < 1e-9


def test_fraction_of_arrivals_that_wait_is_erlang_c(mmc_run: MmcRun) -> None:
    """The simulated P(wait) is within 5% of Erlang C(c, λ/μ)."""
    waited = sum(1 for w in mmc_run.simulated if w > 1e-12) / len(mmc_run.simulated)
    expected = _erlang_c(SERVERS, mmc_run.rho * SERVERS)
    assert waited == pytest.approx(expected, rel=0.05)


@pytest.mark.parametrize(("rho", "n"), [(0.5, 1_000_000), (0.8, 1_000_000), (0.9, 3_000_000)])
def test_mean_wait_of_the_simulated_process_is_erlang_c(rho: float, n: int) -> None:
    """Over 1–3 million arrivals the same process's mean wait is within 5% of C/(cμ − λ)."""
    arrivals, prompts = _draw(rho, SERVERS, n, seed=1)
    waits = _fcfs_waits(arrivals, [BASE_S + SECONDS_PER_TOKEN * p for p in prompts], SERVERS)
    mu = 1.0 / _mean_service_s()
    lam = rho * SERVERS * mu
    expected = _erlang_c(SERVERS, lam / mu) / (SERVERS * mu - lam)
    assert math.fsum(waits) / n == pytest.approx(expected, rel=0.05)


def test_many_servers_and_per_token_service_are_exact_too() -> None:
    """With 8 servers and service made of output tokens (one event each), waits stay exact."""
    c, n = 8, 3000
    engine = EngineConfig(
        max_num_seqs=c,
        max_num_batched_tokens=10**6,
        kv_capacity_tokens=10**9,
        base_s=0.01,
        per_prefill_token_s=1e-5,
        batch_independent=True,
    )
    rng = np.random.default_rng(7)
    outputs = [int(x) for x in np.ceil(rng.exponential(20.0, n))]
    prompts = [int(x) for x in rng.integers(1, 500, n)]
    service = [engine.solo_service_s(p, o) for p, o in zip(prompts, outputs, strict=True)]
    rate = 0.9 * c / float(np.mean(service))
    arrivals = np.cumsum(rng.exponential(1.0 / rate, n)).tolist()
    simulated = _simulated_waits(arrivals, prompts, outputs, engine)
    reference = _fcfs_waits(arrivals, service, c)
    assert max(reference) > 0.5
    assert np.max(np.abs(np.subtract(simulated, reference))) < 1e-9
