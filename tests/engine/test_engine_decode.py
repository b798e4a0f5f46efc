"""Decode runs: ``plan_decode`` / ``advance_decode`` replay exactly what ``step`` would do."""

from __future__ import annotations

import contextlib
import dataclasses
from itertools import cycle

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sluicegate.engine import Engine, EngineConfig, preset

CFG = EngineConfig(
    max_num_seqs=8,
    max_num_batched_tokens=64,
    kv_capacity_tokens=4096,
    block_size=4,
    base_s=0.0065,
    per_prefill_token_s=2.5e-5,
    per_decode_seq_s=3.0e-5,
    per_kv_token_s=5.0e-8,
)


def prefilled(config: EngineConfig, *sizes: tuple[int, int]) -> tuple[Engine, float]:
    """An engine whose requests ``(prompt, output)`` were all admitted and prefilled at 0."""
    engine = Engine(config)
    for i, (prompt, output) in enumerate(sizes):
        engine.add_request(f"r{i}", prompt, output, 0.0, ignore_eos=True)
    result = engine.step(0.0)
    assert result is not None
    assert len(result.first_token) == len(sizes)
    return engine, result.duration_s


def test_a_run_stops_before_the_step_that_finishes_a_request() -> None:
    """With 5 tokens to emit and token 1 out, the run is tokens 2-4; step() then finishes it."""
    engine, now = prefilled(CFG, (10, 5), (10, 50))
    run = engine.plan_decode(100)
    assert run is not None
    assert run.steps == 3
    engine.advance_decode(run, run.steps, now)
    result = engine.step(now)
    assert result is not None
    assert result.finished == ["r0"]


def test_a_run_is_at_most_max_steps_long() -> None:
    """``max_steps`` caps the run."""
    engine, _ = prefilled(CFG, (10, 50))
    run = engine.plan_decode(7)
    assert run is not None
    assert run.steps == 7


def test_durations_and_results_equal_those_of_step_bit_for_bit() -> None:
    """Each planned step's duration and StepResult are exactly what step() returns."""
    planner, now = prefilled(CFG, (30, 40), (7, 40), (20, 40))
    stepper, _ = prefilled(CFG, (30, 40), (7, 40), (20, 40))
    run = planner.plan_decode(16)
    assert run is not None
    for i in range(run.steps):
        assert stepper.step(now) == run.result(i)
        now += run.durations_s[i]


def test_nothing_is_planned_while_a_request_waits() -> None:
    """A waiting request may be admitted at the next step, so that step goes through step()."""
    engine, _ = prefilled(CFG, (10, 50))
    engine.add_request("late", 10, 5, 0.0)
    assert engine.plan_decode(16) is None


def test_nothing_is_planned_while_a_prompt_is_still_prefilling() -> None:
    """A chunked prefill in progress is not a decode."""
    engine = Engine(CFG)
    engine.add_request("long", 200, 5, 0.0)
    assert engine.step(0.0) is not None  # the first 64-token chunk
    assert engine.plan_decode(16) is None


def test_nothing_is_planned_in_batch_independent_mode() -> None:
    """Independent servers have no shared batch to plan."""
    engine = Engine(dataclasses.replace(CFG, batch_independent=True))
    engine.add_request("r", 10, 50, 0.0, ignore_eos=True)
    assert engine.step(0.0) is not None
    assert engine.plan_decode(16) is None


def test_a_run_that_could_need_a_preemption_is_refused_but_a_shorter_one_is_not() -> None:
    """Two sequences needing 3 blocks each in 5 blocks: 6 more steps would exhaust KV, 4 not."""
    tight = dataclasses.replace(CFG, kv_capacity_tokens=20)
    engine, _ = prefilled(tight, (4, 8), (4, 8))
    assert engine.plan_decode(6) is None
    run = engine.plan_decode(4)
    assert run is not None
    assert run.steps == 4


def test_advancing_applies_tokens_and_kv_as_the_steps_would() -> None:
    """After advancing, generated tokens, KV usage and token totals match stepping."""
    planner, now = prefilled(CFG, (10, 50), (3, 50))
    stepper, _ = prefilled(CFG, (10, 50), (3, 50))
    run = planner.plan_decode(16)
    assert run is not None
    planner.advance_decode(run, 9, now)
    for _ in range(9):
        result = stepper.step(now)
        assert result is not None
        now += result.duration_s
    assert planner.generated("r0") == stepper.generated("r0") == 10
    assert planner.kv_cache_usage == stepper.kv_cache_usage
    assert planner.generation_tokens_total == stepper.generation_tokens_total


def test_a_stale_run_is_refused() -> None:
    """A run planned before the engine changed no longer applies."""
    engine, now = prefilled(CFG, (10, 50))
    run = engine.plan_decode(16)
    assert run is not None
    engine.add_request("late", 10, 5, now)
    with pytest.raises(ValueError, match="changed"):
        engine.advance_decode(run, 1, now)


@pytest.mark.parametrize("steps", [0, 17])
def test_advancing_outside_the_run_is_refused(steps: int) -> None:
    """Only 1 … run.steps steps can be applied."""
    engine, now = prefilled(CFG, (10, 50))
    run = engine.plan_decode(16)
    assert run is not None
    with pytest.raises(ValueError, match="steps must be"):
        engine.advance_decode(run, steps, now)


Request = tuple[int, str, int, int]  # (step it arrives before, id, prompt, output)

configs = st.builds(
    EngineConfig,
    max_num_seqs=st.integers(1, 6),
    max_num_batched_tokens=st.integers(4, 96),
    kv_capacity_tokens=st.integers(48, 400),
    block_size=st.integers(1, 8),
    enable_chunked_prefill=st.booleans(),
    base_s=st.sampled_from([0.0065, 0.002, 1e-3 / 3]),
    per_prefill_token_s=st.sampled_from([0.0, 2.5e-5, 1e-4 / 7]),
    per_decode_seq_s=st.sampled_from([0.0, 3.0e-5, 1e-3 / 3]),
    per_kv_token_s=st.sampled_from([0.0, 5.0e-8, 1e-5 / 3]),
)
requests = st.lists(
    st.tuples(st.integers(0, 60), st.integers(1, 40), st.integers(1, 30)), max_size=10
).map(lambda rows: sorted((at, f"q{i}", p, o) for i, (at, p, o) in enumerate(rows)))


def replay(config: EngineConfig, arrivals: list[Request], cuts: list[int]) -> None:
    """Step one engine and drive its twin with decode runs (cut short by arrivals and
    ``cuts``); every step's result and the state at every run's end must agree."""
    stepper, planner = Engine(config, seed=3), Engine(config, seed=3)
    pending = list(arrivals)
    limits = cycle(cuts)
    now, done = 0.0, 0
    while True:
        while pending and pending[0][0] <= done:
            _, rid, prompt, output = pending.pop(0)
            for engine in (stepper, planner):
                with contextlib.suppress(ValueError):  # too large for this config: both refuse
                    engine.add_request(rid, prompt, output, now, ignore_eos=True)
        run = planner.plan_decode(next(limits))
        if run is None:
            result = stepper.step(now)
            assert planner.step(now) == result
            if result is None:
                if not pending:
                    return
                done = pending[0][0]
                continue
            now += result.duration_s
            done += 1
            continue
        steps = min(run.steps, pending[0][0] - done) if pending else run.steps
        for i in range(steps):
            start = now
            assert stepper.step(now) == run.result(i)
            now += run.durations_s[i]
        planner.advance_decode(run, steps, start)
        done += steps
        assert planner.kv_cache_usage == stepper.kv_cache_usage
        assert planner.generation_tokens_total == stepper.generation_tokens_total
        assert [planner.generated(r) for r in run.req_ids] == [
            stepper.generated(r) for r in run.req_ids
        ]


@settings(max_examples=150, deadline=None)
@given(configs, requests, st.lists(st.integers(1, 20), min_size=1, max_size=5))
def test_any_mix_of_runs_and_steps_replays_step_exactly(
    config: EngineConfig, arrivals: list[Request], cuts: list[int]
) -> None:
    """Whatever the config, arrivals and run lengths, decode runs change no result."""
    replay(config, arrivals, cuts)


def test_a_preset_replays_step_exactly_under_kv_pressure() -> None:
    """A calibrated preset with a KV cache small enough to preempt agrees too."""
    config = dataclasses.replace(preset("llama-3.1-8b-h100"), kv_capacity_tokens=400)
    arrivals = [(i * 3, f"q{i}", 20 + 13 * i % 50, 60 + 7 * i % 40) for i in range(12)]
    replay(config, arrivals, [16, 5, 11])
