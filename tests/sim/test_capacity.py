"""Capacity of a configuration on a workload: the saturation run of ``sim/capacity.py``
against the engine model's analytic throughput (DESIGN §12)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sluicegate.core.component_specs import BackendSpec
from sluicegate.core.spec import LaneSpec, ModelSpec, SchedulerSpec, TenantSpec
from sluicegate.engine.engine_config import EngineConfig
from sluicegate.outcomes import WorkloadRequest
from sluicegate.sim.capacity import (
    MIN_SAMPLE,
    SAMPLE_PER_SLOT,
    measure_capacity,
    saturation_sample,
    slot_cap,
    steady_rate,
)

MODEL = "m"


def engine(*, independent: bool, max_num_seqs: int = 64, base_s: float = 0.01) -> EngineConfig:
    """An engine whose step always costs ``base_s`` (no per-token cost), ample KV."""
    return EngineConfig(
        max_num_seqs=max_num_seqs, max_num_batched_tokens=4096, kv_capacity_tokens=1_000_000,
        base_s=base_s, batch_independent=independent,
    )  # fmt: skip


def spec(lane_cap: int, *, model_cap: int = 64, **lane: object) -> SchedulerSpec:
    """One model with one lane ``main`` capped at ``lane_cap``."""
    fields: dict[str, object] = {"name": "main", "max_concurrency": lane_cap, **lane}
    return SchedulerSpec(
        models=(ModelSpec(name=MODEL, lanes=(LaneSpec(**fields),), max_concurrency=model_cap),),
    )  # fmt: skip


def fixed(n: int, prompt: int, output: int, rate: float = 1.0) -> list[WorkloadRequest]:
    """``n`` identical requests arriving ``rate`` per second."""
    return [WorkloadRequest(i / rate, prompt, output, output, lane="main") for i in range(n)]


@settings(max_examples=8, deadline=None)
@given(
    cap=st.integers(1, 12),
    replicas=st.integers(1, 3),
    output=st.integers(2, 40),
    prompt=st.integers(1, 3000),
)
def test_batch_independent_capacity_is_slots_over_service_time(
    cap: int, replicas: int, output: int, prompt: int
) -> None:
    """With a batch-independent engine every slot is a server of deterministic service
    time S = ``solo_service_s``, so all requests arriving at 0 finish in waves of ``cap``
    at S, 2S, …; the steady window spans whole waves, so the measured rate is
    ``cap / S`` up to float rounding (relative 1e-9)."""
    eng = engine(independent=True)
    measured = measure_capacity(spec(cap), MODEL, fixed(50, prompt, output), eng, replicas)
    assert measured is not None
    assert measured.rps == pytest.approx(cap / eng.solo_service_s(prompt, output), rel=1e-9)
    assert measured.requests == max(MIN_SAMPLE, SAMPLE_PER_SLOT * cap)


@pytest.mark.parametrize(("cap", "output"), [(1, 10), (8, 50), (32, 7)])
def test_shared_batch_capacity_matches_lockstep_decoding(cap: int, output: int) -> None:
    """A shared batch whose step costs ``base_s`` whatever it holds: the prefill step
    emits token 1 and each decode step one more, so a request takes ``output`` steps and
    ``cap`` of them run in lockstep: ``cap / (output · base_s)`` (relative 1e-9)."""
    eng = engine(independent=False)
    measured = measure_capacity(spec(cap), MODEL, fixed(30, 100, output), eng, 1)
    assert measured is not None
    assert measured.rps == pytest.approx(cap / (output * eng.base_s), rel=1e-9)


def test_engine_batch_cap_bounds_capacity() -> None:
    """Gateway caps above the engine's ``max_num_seqs`` do not count: 2 replicas × 3 seqs."""
    eng = engine(independent=True, max_num_seqs=3)
    measured = measure_capacity(spec(16), MODEL, fixed(10, 10, 20), eng, 2)
    assert measured is not None
    assert measured.rps == pytest.approx(6 / eng.solo_service_s(10, 20), rel=1e-9)


def test_admission_limits_and_policy_do_not_change_capacity() -> None:
    """Queue caps, timeouts, SLOs, preemption, tenant rate limits and the lane's policy
    are lifted for the saturation run: capacity is the same as without them."""
    eng = engine(independent=False)
    work = fixed(40, 200, 30)
    plain = measure_capacity(spec(8), MODEL, work, eng, 1, seed=5)
    strict = spec(
        8, max_queue=1, queue_timeout_s=0.001, slo_ms=1.0, policy="fair", shed_hopeless=True
    ).model_copy(update={"tenants": (TenantSpec(name="default", requests_per_s=0.1),)})
    limited = measure_capacity(strict, MODEL, work, eng, 1, seed=5)
    assert plain is not None
    assert limited is not None
    assert limited == plain


def test_capacity_is_deterministic() -> None:
    """The same inputs give the same figure, run after run (nothing cached or random)."""
    eng = engine(independent=False)
    work = [
        WorkloadRequest(i * 0.3, 50 + 37 * i % 900, 5 + 13 * i % 40, 400, lane="main")
        for i in range(60)
    ]
    first = measure_capacity(spec(8), MODEL, work, eng, 2, seed=1)
    assert first is not None
    assert measure_capacity(spec(8), MODEL, work, eng, 2, seed=1) == first


def test_slot_cap_is_the_smallest_cap() -> None:
    """Model cap, summed lane caps, replicas × backend cap and replicas × max_num_seqs."""
    two_lanes = SchedulerSpec(
        models=(
            ModelSpec(
                name=MODEL, max_concurrency=100,
                lanes=(
                    LaneSpec(name="a", max_concurrency=5), LaneSpec(name="b", max_concurrency=7),
                ),
            ),
        )
    )  # fmt: skip
    assert slot_cap(two_lanes, MODEL, 1, 64) == 12
    assert slot_cap(two_lanes, MODEL, 3, 2) == 6
    assert slot_cap(spec(50, model_cap=9), MODEL, 1, 64) == 9
    backend = (
        spec(50)
        .models[0]
        .model_copy(update={"backends": (BackendSpec(name="x", max_concurrency=4),)})
    )
    assert slot_cap(SchedulerSpec(models=(backend,)), MODEL, 2, 64) == 8


def test_saturation_sample_spreads_and_repeats_evenly() -> None:
    """A sample takes evenly spaced requests, repeats a short workload evenly, and every
    request arrives at 0 with no deadline of its own."""
    work = [
        WorkloadRequest(float(i), 10 + i, 5, 5, lane="main", deadline_ms=100.0) for i in range(10)
    ]
    picked = saturation_sample(work, 5)
    assert [w.prompt_tokens for w in picked] == [10, 12, 14, 16, 18]
    repeated = saturation_sample(work, 25)
    counts = [sum(w.prompt_tokens == 10 + i for w in repeated) for i in range(10)]
    assert sum(counts) == 25
    assert max(counts) - min(counts) <= 1
    assert all(w.arrival_s == 0.0 and w.deadline_ms is None for w in repeated)


def test_steady_rate_counts_the_middle_half() -> None:
    """Finishes 0…9: the window runs from the 3rd (2.0) to the 8th (7.0) finish and holds
    5 completions after its start: 1 per second. Too few or simultaneous finishes: None."""
    assert steady_rate([float(t) for t in range(10)]) == (1.0, 5.0)
    assert steady_rate([1.0, 2.0, 3.0]) is None
    assert steady_rate([4.0] * 10) is None
