"""The prefill attention term: a prompt's prefill cost grows with its square, and chunked
prefill (vLLM's, llama.cpp's ``n_batch``) pays the same pairs as one step would."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from sluicegate.engine.engine_config import EngineConfig
from sluicegate.engine.model import Engine

ATTN = 1e-8


def _config(budget: int, attn: float = ATTN) -> EngineConfig:
    return EngineConfig(
        max_num_seqs=4, max_num_batched_tokens=budget, kv_capacity_tokens=1 << 16,
        base_s=1e-3, per_prefill_token_s=1e-5, per_prefill_attn_s=attn,
    )  # fmt: skip


def _prefill_steps(config: EngineConfig, prompt: int) -> list[float]:
    """The durations of the steps up to and including the one emitting the first token."""
    engine = Engine(config)
    engine.add_request("a", prompt, 2, 0.0)
    durations, now = [], 0.0
    while True:
        result = engine.step(now)
        assert result is not None
        durations.append(result.duration_s)
        now += result.duration_s
        if result.first_token:
            return durations


def test_one_prefill_step_pays_every_query_key_pair() -> None:
    """A 1,000-token prompt in one step: 1000·1001/2 pairs on top of the linear terms."""
    (step,) = _prefill_steps(_config(4096), 1000)
    (linear,) = _prefill_steps(_config(4096, attn=0.0), 1000)
    assert abs(step - linear - 1000 * 1001 // 2 * ATTN) < 1e-15


@given(st.integers(1, 3000), st.integers(16, 1024))
def test_chunks_pay_the_same_pairs_as_one_step(prompt: int, budget: int) -> None:
    """Chunk k of n tokens after c computed attends n·c + n(n+1)/2 pairs; over all chunks
    that is p(p+1)/2 whatever the budget, so chunking adds only its per-step base costs."""
    steps = _prefill_steps(_config(budget), prompt)
    linear = _prefill_steps(_config(budget, attn=0.0), prompt)
    assert len(steps) == -(-prompt // budget)
    extra = sum(steps) - sum(linear)
    assert abs(extra - prompt * (prompt + 1) // 2 * ATTN) < 1e-12 * len(steps)


@given(st.integers(1, 3000), st.integers(1, 50), st.integers(16, 1024))
def test_solo_service_matches_the_engine(prompt: int, output: int, budget: int) -> None:
    """``solo_service_s`` is what the engine takes for a request alone, attention included;
    ``solo_latency_s`` adds the request's two fixed overheads."""
    config = EngineConfig(
        max_num_seqs=4, max_num_batched_tokens=budget, kv_capacity_tokens=1 << 16,
        base_s=1e-3, per_prefill_token_s=1e-5, per_kv_token_s=1e-7, per_prefill_attn_s=ATTN,
        request_overhead_s=0.002, response_overhead_s=0.003,
    )  # fmt: skip
    engine = Engine(config)
    engine.add_request("a", prompt, output, 0.0, ignore_eos=True)
    now = 0.0
    while (result := engine.step(now)) is not None:
        now += result.duration_s
    assert abs(now - config.solo_service_s(prompt, output)) < 1e-9
    assert abs(config.solo_latency_s(prompt, output) - now - 0.005) < 1e-9
