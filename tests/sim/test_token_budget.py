"""A long-prompt workload does not collapse the engine model with the default config (DESIGN §5).

Prompts are lognormal with median 8,000 tokens and σ 0.9 (mean ≈ 12k, clipped to
256 … 100,000 tokens), outputs lognormal with median 256 (at most 4,096), on one
``llama-3.1-8b-h100`` replica (448,000 KV tokens). With the default config the
model's in-flight token budget is ``auto``: 0.9 × 448,000 = 403,200 tokens,
known from the simulator's scrape of the preset before the first request.

The bound on KV preemptions with the default is 0. The budget charges every
running request its whole end-of-life footprint (prompt + predicted output) while
the engine holds only what was prefilled and generated so far, so the KV cache
can only run out if outputs exceed their predictions by more than the 10 %
headroom (44,800 tokens) summed over the ~35 requests that fit, or if a request
larger than the budget runs (none here: prompt + max_tokens ≤ 104,096). With
outputs of mean ≈ 420 and at most 4,096 tokens that does not happen in these
seeded runs; the unbounded runs preempt hundreds of times.
"""

from __future__ import annotations

import pytest

from sluicegate.core.spec import LaneSpec, ModelSpec, SchedulerSpec
from sluicegate.engine import preset
from sluicegate.outcomes import WorkloadRequest
from sluicegate.sim.result import SimResult
from sluicegate.sim.virtual_driver import simulate
from sluicegate.sim.workloads.synthetic import LengthDist, poisson

H100 = preset("llama-3.1-8b-h100")
PROMPT = LengthDist.lognormal(8000.0, 0.9, min_tokens=256, max_tokens=100_000)
OUTPUT = LengthDist.lognormal(256.0, 1.0, max_tokens=4096)
UNBOUNDED = 10**9
COMPLETED = "completed"


def _workload(rate_per_s: float, seed: int) -> list[WorkloadRequest]:
    return poisson(rate_per_s, 600.0, seed=seed, prompt=PROMPT, output=OUTPUT)


def _run(model: ModelSpec, workload: list[WorkloadRequest], seed: int) -> SimResult:
    return simulate(SchedulerSpec(models=(model,)), "m", workload, H100, 1, seed=seed)


def _completed(result: SimResult) -> int:
    return sum(1 for record in result.records if record.outcome == COMPLETED)


def _patient(budget: int | str | None) -> ModelSpec:
    """One lane that never expires, so every request completes and throughput is comparable."""
    lane = LaneSpec(
        name="interactive",
        max_concurrency=64,
        max_queue=100_000,
        queue_timeout_s=1e6,
        slo_ms=1e9,
        policy="fifo",
        preemptible="never",
    )
    return ModelSpec(name="m", lanes=(lane,), max_inflight_tokens=budget)


def test_workload_has_long_prompts() -> None:
    """The workload is what the module docstring says: mean prompt ≈ 12k, tail near 100k."""
    workload = _workload(1.4, seed=1)
    prompts = [request.prompt_tokens for request in workload]
    assert 11_000 <= sum(prompts) / len(prompts) <= 13_000
    assert max(prompts) >= 60_000
    assert max(r.prompt_tokens + r.max_tokens for r in workload) <= 104_096


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_default_config_does_not_thrash_near_capacity(seed: int) -> None:
    """At ≈ 0.9 of the budgeted capacity (≈ 1.5 req/s), the default config (default
    lanes and ``auto`` budget) has no KV preemption and loses fewer requests to the
    interactive lane's 30 s queue timeout than with the budget off, which thrashes."""
    workload = _workload(1.4, seed)
    default = _run(ModelSpec(name="m"), workload, seed)
    off = _run(ModelSpec(name="m", max_inflight_tokens=None), workload, seed)
    assert default.engine_preemptions == 0
    assert off.engine_preemptions >= 100
    assert _completed(default) >= _completed(off)


@pytest.mark.parametrize("rate_per_s", [1.4, 2.5])
def test_auto_budget_throughput_at_least_unbounded(rate_per_s: float) -> None:
    """With requests that never expire, near capacity and overloaded: the ``auto`` budget
    has no KV preemption and finishes all the work no later than an unbounded budget."""
    workload = _workload(rate_per_s, seed=1)
    auto = _run(_patient("auto"), workload, seed=1)
    unbounded = _run(_patient(UNBOUNDED), workload, seed=1)
    assert auto.engine_preemptions == 0
    assert unbounded.engine_preemptions >= 100
    assert _completed(auto) == _completed(unbounded) == len(workload)
    assert auto.span_s <= unbounded.span_s


def test_request_larger_than_the_budget_runs_alone() -> None:
    """A 420,000-token prompt (over the 403,200 budget, within the KV cache) still completes:
    it is admitted once nothing else runs, and nothing is preempted for it."""
    workload = _workload(0.5, seed=4)
    huge = WorkloadRequest(arrival_s=30.0, prompt_tokens=420_000, output_tokens=64, max_tokens=64)
    result = _run(_patient("auto"), [*workload, huge], seed=4)
    record = next(r for r in result.records if r.prompt_tokens == 420_000)
    assert record.outcome == COMPLETED
    assert all(r.outcome == COMPLETED for r in result.records)
    assert result.engine_preemptions == 0
    start, end = record.admit_s, record.finish_s
    assert start is not None
    assert end is not None
    spans = [(r.admit_s, r.finish_s) for r in result.records if r is not record]
    assert all(a is not None and b is not None and (b <= start or a >= end) for a, b in spans), (
        "the huge request ran alongside another"
    )


def test_independent_servers_report_no_capacity() -> None:
    """A ``batch_independent`` preset models no shared KV cache, so an ``auto`` budget stays
    unset and the queueing-theory runs are unchanged: the same records as with ``off``."""
    engine = preset("independent")
    workload = poisson(50.0, 20.0, seed=5, prompt=PROMPT, output=OUTPUT)
    runs = [
        simulate(SchedulerSpec(models=(_patient(budget),)), "m", workload, engine, 1, seed=5)
        for budget in ("auto", None)
    ]
    assert runs[0].records == runs[1].records
