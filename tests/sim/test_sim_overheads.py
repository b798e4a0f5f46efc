"""The engine model's per-request overheads in the simulator (DESIGN §12).

``request_overhead_s`` delays a request's arrival at the engine after the gateway
dispatches it (its slot held meanwhile); ``response_overhead_s`` delays every first and
last token's arrival at the gateway after its step. The figures here are powers of two,
so every sum is exact and times can be compared with ``==``.
"""

from __future__ import annotations

import dataclasses

import pytest

from sluicegate.engine import EngineConfig
from sluicegate.outcomes import WorkloadRequest
from sluicegate.sim.virtual_driver import simulate
from tests.sim.test_driver import lane, spec

EXACT = EngineConfig(
    max_num_seqs=4,
    max_num_batched_tokens=64,
    kv_capacity_tokens=4096,
    block_size=16,
    base_s=2.0**-7,
    per_prefill_token_s=2.0**-12,
    per_decode_seq_s=2.0**-10,
)
OVERHEADS = dataclasses.replace(EXACT, request_overhead_s=0.25, response_overhead_s=0.125)


def solo(
    engine: EngineConfig, prompt: int, output: int, arrival: float = 0.0
) -> tuple[float, float]:
    """A request alone on one replica: its TTFT and end-to-end latency."""
    work = [WorkloadRequest(arrival, prompt, output, output, lane="main")]
    (record,) = simulate(spec(), "m", work, engine, 1).records
    assert record.first_token_s is not None
    assert record.finish_s is not None
    return record.first_token_s - arrival, record.finish_s - arrival


@pytest.mark.parametrize("prompt", [40, 64, 150])
def test_a_solo_requests_latencies_are_the_engine_models_solo_latency(prompt: int) -> None:
    """TTFT is ``solo_latency_s(prompt, 1)`` and e2e ``solo_latency_s(prompt, output)``,
    both overheads included, prompts chunked or not; without overheads they are less by
    exactly the overheads' sum."""
    ttft, e2e = solo(OVERHEADS, prompt, 9, arrival=2.0)
    assert ttft == OVERHEADS.solo_latency_s(prompt, 1)
    assert e2e == OVERHEADS.solo_latency_s(prompt, 9)
    bare_ttft, bare_e2e = solo(EXACT, prompt, 9, arrival=2.0)
    assert (ttft - bare_ttft, e2e - bare_e2e) == (0.375, 0.375)


def test_a_request_in_transit_holds_its_gateway_slot() -> None:
    """With one slot, the second request waits while the first is still on its way to the
    engine: the scrape at 0.125 s finds the engine empty and the second queued, and the
    second is admitted only when the first's last token reaches the gateway."""
    slow = dataclasses.replace(OVERHEADS, request_overhead_s=0.5)
    work = [WorkloadRequest(0.0, 40, 5, 5, lane="main") for _ in range(2)]
    result = simulate(spec(lane(max_concurrency=1), cap=1), "m", work, slow, 1,
                      scrape_interval_s=0.125)  # fmt: skip
    first, second = result.records
    index = result.samples.times.index(0.125)
    assert result.samples.running[index] == (0,)
    assert result.samples.queued["main"][index] == 1
    assert first.finish_s == slow.solo_latency_s(40, 5)
    assert second.admit_s == first.finish_s


def test_a_request_preempted_in_transit_never_reaches_the_engine() -> None:
    """A low-priority request preempted before its request overhead has passed ends with
    no tokens and no engine step spent on it; the urgent one runs alone."""
    slow = dataclasses.replace(OVERHEADS, request_overhead_s=0.5)
    work = [
        WorkloadRequest(0.0, 40, 5, 5, lane="main", priority=5),
        WorkloadRequest(0.25, 40, 5, 5, lane="main", priority=0, deadline_ms=100.0),
    ]
    base = spec(lane(max_concurrency=1, preemptible="priority"), cap=1)
    result = simulate(base, "m", work, slow, 1)
    low, urgent = result.records
    alone = simulate(base, "m", work[1:], slow, 1)
    assert result.engine_steps == alone.engine_steps
    assert (low.outcome, low.generated_tokens, low.first_token_s) == ("preempted", 0, None)
    assert urgent.finish_s is not None
    assert urgent.finish_s - urgent.arrival_s == slow.solo_latency_s(40, 5)


def test_zero_overheads_are_the_model_without_them() -> None:
    """Overheads of zero are what the presets have: no event is added, and a busy run's
    records equal those of an engine config that never named them."""
    work = [WorkloadRequest(0.01 * i, 30 + i, 4 + i % 7, 20, lane="main") for i in range(60)]
    named = dataclasses.replace(EXACT, request_overhead_s=0.0, response_overhead_s=0.0)
    with_overheads = simulate(spec(cap=4), "m", work, OVERHEADS, 2)
    assert simulate(spec(cap=4), "m", work, named, 2) == simulate(spec(cap=4), "m", work, EXACT, 2)
    assert with_overheads.records != simulate(spec(cap=4), "m", work, EXACT, 2).records
