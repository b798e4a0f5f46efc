"""The batched engine model: tokens, admission, KV, preemption, chunked prefill, timing."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sluicegate.engine import Engine, EngineConfig, StepResult, preset
from tests.engine.engine_harness import Arrival, drive

SMALL = EngineConfig(
    max_num_seqs=4, max_num_batched_tokens=256, kv_capacity_tokens=4096, block_size=4,
    base_s=0.01, per_prefill_token_s=1e-4, per_decode_seq_s=1e-3, per_kv_token_s=1e-5,
)  # fmt: skip
"""A small engine with round numbers, so expected timings are easy to write."""


def small_config(**changes: object) -> EngineConfig:
    """``SMALL`` with ``changes`` (``EngineConfig`` fields)."""
    return dataclasses.replace(SMALL, **changes)  # type: ignore[arg-type]


def step_with_newcomer(engine: Engine, prompt: int, max_tokens: int) -> StepResult:
    """Two 8-token prompts admitted and decoding (after one step at t=0), then a prompt of
    ``prompt`` tokens arrives: the step at t=0.1."""
    engine.add_request("a", 8, 10, 0.0, ignore_eos=True)
    engine.add_request("b", 8, 10, 0.0, ignore_eos=True)
    engine.step(0.0)
    engine.add_request("new", prompt, max_tokens, 0.0, ignore_eos=True)
    result = engine.step(0.1)
    assert result is not None
    return result


def test_single_request_with_ignore_eos_emits_exactly_max_tokens_then_finishes() -> None:
    """With ignore_eos a request emits max_tokens tokens, one per step, and finishes on the last."""
    engine = Engine(small_config())
    trace = drive(engine, [Arrival(0.0, "r", 10, 7, ignore_eos=True)])
    assert [r.tokens for r in trace.results()] == [{"r": 1}] * 7
    assert [r.finished for r in trace.results()] == [[]] * 6 + [["r"]]
    assert engine.is_idle


def test_first_token_comes_from_the_step_that_prefills_the_prompt() -> None:
    """The first step prefills the whole prompt and emits token 1, timed by the step formula."""
    cfg = small_config()
    trace = drive(Engine(cfg), [Arrival(0.0, "r", 100, 3, ignore_eos=True)])
    first = trace.results()[0]
    assert first.first_token == ["r"]
    assert first.prefill_tokens == 100
    assert first.decode_seqs == 0
    assert first.duration_s == pytest.approx(cfg.step_s(100, 0, 100))


def test_decode_step_time_is_base_plus_per_seq_plus_attended_context() -> None:
    """A decode step for one sequence costs base + b + c·context, the context counting the
    token being computed."""
    cfg = small_config()
    trace = drive(Engine(cfg), [Arrival(0.0, "r", 100, 3, ignore_eos=True)])
    durations = [r.duration_s for r in trace.results()[1:]]
    assert durations == pytest.approx([cfg.step_s(0, 1, 101), cfg.step_s(0, 1, 102)])


def test_service_time_alone_matches_solo_service_s() -> None:
    """A lone request's admission-to-finish time equals EngineConfig.solo_service_s."""
    cfg = small_config(max_num_batched_tokens=64)
    trace = drive(Engine(cfg), [Arrival(0.0, "r", 150, 20, ignore_eos=True)])
    assert trace.finish_time("r") == pytest.approx(cfg.solo_service_s(150, 20))


def test_output_tokens_from_a_trace_are_used_and_capped_by_max_tokens() -> None:
    """A given output length is used as is, and capped at max_tokens."""
    engine = Engine(small_config())
    trace = drive(
        engine,
        [Arrival(0.0, "short", 10, 50, output_tokens=3), Arrival(0.0, "capped", 10, 4, 9)],
    )
    assert trace.tokens_of("short") == 3
    assert trace.tokens_of("capped") == 4


def test_requests_are_admitted_first_come_first_served() -> None:
    """With one slot, requests get their first token in arrival order."""
    engine = Engine(small_config(max_num_seqs=1))
    arrivals = [Arrival(0.001 * i, f"r{i}", 5, 2, ignore_eos=True) for i in range(4)]
    trace = drive(engine, arrivals)
    order = [rid for r in trace.results() for rid in r.first_token]
    assert order == ["r0", "r1", "r2", "r3"]


def test_head_of_queue_that_does_not_fit_blocks_later_requests() -> None:
    """FCFS without skipping: a small request behind a big one that lacks KV waits for it."""
    cfg = small_config(kv_capacity_tokens=64, block_size=4, max_num_batched_tokens=1024)
    engine = Engine(cfg)
    engine.add_request("running", 40, 4, 0.0, ignore_eos=True)
    engine.step(0.0)
    engine.add_request("big", 40, 4, 0.0, ignore_eos=True)
    engine.add_request("small", 4, 1, 0.0, ignore_eos=True)
    trace = drive(engine, [])
    order = [rid for r in trace.results() for rid in r.first_token]
    assert order == ["big", "small"]


def test_max_num_seqs_caps_the_running_batch() -> None:
    """No more than max_num_seqs requests run at once; the rest wait."""
    engine = Engine(small_config(max_num_seqs=3))
    for i in range(5):
        engine.add_request(f"r{i}", 4, 10, 0.0, ignore_eos=True)
    engine.step(0.0)
    assert (engine.num_requests_running, engine.num_requests_waiting) == (3, 2)


def test_chunked_prefill_splits_a_long_prompt_within_the_budget() -> None:
    """A prompt longer than the token budget is prefilled over several steps, each within it."""
    cfg = small_config(max_num_batched_tokens=64)
    trace = drive(Engine(cfg), [Arrival(0.0, "r", 200, 2, ignore_eos=True)])
    chunks = [r.prefill_tokens for r in trace.results()[:4]]
    assert chunks == [64, 64, 64, 8]
    assert [r.first_token for r in trace.results()[:4]] == [[], [], [], ["r"]]
    contexts = [64, 128, 192, 200]
    expected = [cfg.step_s(n, 0, c) for n, c in zip(chunks, contexts, strict=True)]
    assert [r.duration_s for r in trace.results()[:4]] == pytest.approx(expected)


def test_decodes_take_the_budget_before_a_waiting_prefill() -> None:
    """Running sequences decode first; a newly admitted prompt gets what is left of the budget."""
    result = step_with_newcomer(Engine(small_config(max_num_batched_tokens=32)), 100, 2)
    assert (result.decode_seqs, result.prefill_tokens) == (2, 30)


def test_without_chunked_prefill_a_prompt_waits_for_a_step_with_room() -> None:
    """With chunked prefill off, a prompt larger than the budget left is not split: it waits."""
    engine = Engine(small_config(max_num_batched_tokens=32, enable_chunked_prefill=False))
    result = step_with_newcomer(engine, 31, 1)
    assert (result.decode_seqs, result.prefill_tokens) == (2, 0)
    assert engine.num_requests_waiting == 1


def test_kv_exhaustion_preempts_the_newest_which_still_emits_its_full_output() -> None:
    """When KV runs out, the most recently admitted sequence is preempted (recompute) and
    later finishes with exactly its full output, its first token reported once."""
    cfg = small_config(kv_capacity_tokens=40, block_size=4)
    engine = Engine(cfg)
    trace = drive(
        engine,
        [Arrival(0.0, "old", 8, 20, ignore_eos=True), Arrival(0.0, "new", 8, 20, ignore_eos=True)],
    )
    preempted = [rid for r in trace.results() for rid in r.preempted]
    assert preempted
    assert set(preempted) == {"new"}
    assert engine.num_preemptions_total == len(preempted)
    assert (trace.tokens_of("old"), trace.tokens_of("new")) == (20, 20)
    assert [rid for r in trace.results() for rid in r.first_token].count("new") == 1


def test_a_preempted_request_recomputes_its_prompt_and_generated_tokens() -> None:
    """After preemption the prefill (here chunked) covers prompt + tokens generated so far."""
    engine = Engine(small_config(kv_capacity_tokens=40, block_size=4, max_num_batched_tokens=8))
    trace = drive(
        engine,
        [Arrival(0.0, "old", 8, 20, ignore_eos=True), Arrival(0.0, "new", 8, 20, ignore_eos=True)],
    )
    results = trace.results()
    last = max(i for i, r in enumerate(results) if r.preempted)
    generated = sum(r.tokens.get("new", 0) for r in results[: last + 1])
    resumed = next(i for i in range(last + 1, len(results)) if "new" in results[i].tokens)
    recomputed = [r.prefill_tokens for r in results[last + 1 : resumed + 1]]
    assert len(recomputed) > 1
    assert sum(recomputed) == 8 + generated


def test_no_request_is_admitted_in_a_step_that_preempted() -> None:
    """As in vLLM v1, a step that had to preempt admits nothing from the waiting queue."""
    engine = Engine(small_config(kv_capacity_tokens=48, block_size=4, max_num_batched_tokens=8))
    arrivals = [Arrival(0.0, f"r{i}", 4, 16, ignore_eos=True) for i in range(3)]
    trace = drive(engine, arrivals)
    with_preemption = [r for r in trace.results() if r.preempted]
    assert with_preemption
    assert all(r.prefill_tokens == 0 and not r.first_token for r in with_preemption)


def test_blocks_of_a_finishing_request_are_free_only_after_its_step() -> None:
    """KV of a request finishing in a step is released after it, not to that step's admissions."""
    engine = Engine(small_config(kv_capacity_tokens=16, block_size=4))
    trace = drive(
        engine,
        [Arrival(0.0, "a", 12, 2, ignore_eos=True), Arrival(0.0, "b", 8, 1, ignore_eos=True)],
    )
    steps = [(r.finished, r.first_token) for r in trace.results()]
    assert steps == [([], ["a"]), (["a"], []), (["b"], ["b"])]


def test_abort_of_a_running_request_frees_its_kv_at_once() -> None:
    """Abort removes a running request and returns its blocks before the next step."""
    engine = Engine(small_config())
    engine.add_request("r", 100, 50, 0.0, ignore_eos=True)
    engine.step(0.0)
    assert engine.kv_cache_usage > 0
    assert engine.abort("r") is True
    assert (engine.kv_cache_usage, engine.num_requests_running) == (0.0, 0)
    assert engine.step(1.0) is None


def test_abort_of_a_waiting_request_removes_it_from_the_queue() -> None:
    """Abort of a queued request takes it out of the waiting queue."""
    engine = Engine(small_config(max_num_seqs=1))
    engine.add_request("a", 4, 5, 0.0, ignore_eos=True)
    engine.add_request("b", 4, 5, 0.0, ignore_eos=True)
    engine.step(0.0)
    assert engine.abort("b") is True
    assert engine.num_requests_waiting == 0
    with pytest.raises(KeyError):
        engine.generated("b")


def test_abort_of_an_unknown_request_returns_false() -> None:
    """Abort of a request the engine does not hold reports False."""
    assert Engine(small_config()).abort("ghost") is False


def test_generated_counts_tokens_of_a_live_request() -> None:
    """generated(req_id) is the number of tokens emitted so far."""
    engine = Engine(small_config())
    engine.add_request("r", 4, 10, 0.0, ignore_eos=True)
    for i in range(3):
        engine.step(float(i))
    assert engine.generated("r") == 3
    assert engine.generation_tokens_total == 3


@pytest.mark.parametrize("name", ["tiny", "llama-3.1-8b-h100"])
def test_decode_step_time_grows_with_batch_size(name: str) -> None:
    """In a shared batch, each extra decoding sequence makes the step longer."""
    durations = []
    for batch in (1, 4, 16):
        engine = Engine(preset(name))
        for i in range(batch):
            engine.add_request(f"r{i}", 64, 10, 0.0, ignore_eos=True)
        engine.step(0.0)
        result = engine.step(1.0)
        assert result is not None
        assert result.decode_seqs == batch
        durations.append(result.duration_s)
    assert durations[0] < durations[1] < durations[2]


def test_same_seed_and_inputs_give_identical_step_results() -> None:
    """The engine is deterministic: same seed and calls, same StepResult sequence."""
    arrivals = [Arrival(0.003 * i, f"r{i}", 20 + 7 * i, 64) for i in range(30)]
    cfg = small_config(kv_capacity_tokens=512)

    def run(seed: int) -> list[StepResult]:
        return drive(Engine(cfg, seed=seed), arrivals).results()

    assert run(7) == run(7)
    assert run(7) != run(8)


def test_idle_engine_step_returns_none() -> None:
    """With nothing waiting or running, step reports that there is nothing to do."""
    assert Engine(small_config()).step(0.0) is None


def test_duplicate_request_id_is_rejected() -> None:
    """A request id already in the engine cannot be added again."""
    engine = Engine(small_config())
    engine.add_request("r", 4, 4, 0.0)
    with pytest.raises(ValueError, match="already"):
        engine.add_request("r", 4, 4, 0.0)


def test_request_larger_than_kv_capacity_is_rejected() -> None:
    """A request whose prompt + max_tokens exceed the KV capacity could never run."""
    engine = Engine(small_config(kv_capacity_tokens=64))
    with pytest.raises(ValueError, match="KV capacity"):
        engine.add_request("r", 60, 10, 0.0)


def test_config_rejects_out_of_range_values_with_the_allowed_range() -> None:
    """Config validation names the field and its allowed range."""
    with pytest.raises(ValueError, match=r"max_num_seqs must be in \[1, "):
        small_config(max_num_seqs=0)
    with pytest.raises(ValueError, match="per_kv_token_s must be a finite number"):
        small_config(per_kv_token_s=-1.0)
    with pytest.raises(ValueError, match="kv_capacity_tokens must be >= block_size"):
        small_config(kv_capacity_tokens=2, block_size=4)


request_strategy = st.tuples(
    st.floats(0.0, 0.05),  # gap to the previous arrival
    st.integers(1, 120),  # prompt tokens
    st.integers(1, 40),  # max tokens
    st.one_of(st.none(), st.integers(0, 60)),  # output tokens from a trace
)


@settings(max_examples=60, deadline=None)
@given(
    max_num_seqs=st.integers(1, 6),
    budget=st.integers(8, 200),
    block_size=st.sampled_from([1, 4, 16]),
    spare_blocks=st.integers(0, 12),
    chunked=st.booleans(),
    requests=st.lists(request_strategy, min_size=1, max_size=25),
)
def test_invariants_hold_at_every_step_under_random_load(
    max_num_seqs: int,
    budget: int,
    block_size: int,
    spare_blocks: int,
    chunked: bool,
    requests: list[tuple[float, int, int, int | None]],
) -> None:
    """Every step: running ≤ max_num_seqs, KV usage in [0, 1], tokens within the budget;
    in the end every request emitted exactly its planned output, first token once."""
    biggest = max(p + m for _, p, m, _ in requests)
    if not chunked:
        budget = max(budget, biggest)
    cfg = small_config(
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=budget,
        block_size=block_size,
        kv_capacity_tokens=(-(-biggest // block_size) + spare_blocks) * block_size,
        enable_chunked_prefill=chunked,
    )
    engine = Engine(cfg, seed=3)
    arrivals, at = [], 0.0
    for i, (gap, prompt, max_tokens, output) in enumerate(requests):
        at += gap
        arrivals.append(Arrival(at, f"r{i}", prompt, max_tokens, output_tokens=output))

    def check(engine: Engine, result: StepResult) -> None:
        assert engine.num_requests_running <= max_num_seqs
        assert 0.0 <= engine.kv_cache_usage <= 1.0
        assert result.prefill_tokens + result.decode_seqs <= budget
        assert len(result.tokens) <= max_num_seqs

    trace = drive(engine, arrivals, check=check)
    for a in arrivals:
        planned = engine.planned_output_tokens(
            a.req_id, a.prompt_tokens, a.max_tokens, output_tokens=a.output_tokens
        )
        assert trace.tokens_of(a.req_id) == planned
        assert [rid for r in trace.results() for rid in r.first_token].count(a.req_id) == 1
        assert [rid for r in trace.results() for rid in r.finished].count(a.req_id) == 1
    assert engine.is_idle
    assert engine.kv_cache_usage == 0.0
