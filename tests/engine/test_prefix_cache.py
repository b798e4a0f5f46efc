"""The engine's prefix cache: skipped prefill, hit counters, LRU order and capacity (DESIGN §11)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sluicegate.engine import Engine, EngineConfig, StepResult
from sluicegate.engine.prefix_cache import PrefixCache

BLOCK = 16


def config(**changes: object) -> EngineConfig:
    """Round coefficients so the expected step times are easy to write."""
    fields: dict[str, object] = {
        "max_num_seqs": 8,
        "max_num_batched_tokens": 4096,
        "kv_capacity_tokens": 16384,
        "block_size": BLOCK,
        "base_s": 0.01,
        "per_prefill_token_s": 1e-4,
        "per_decode_seq_s": 1e-3,
        "per_kv_token_s": 1e-6,
    }
    fields.update(changes)
    return EngineConfig(**fields)  # type: ignore[arg-type]


def run_alone(engine: Engine, req_id: str, prompt: int, prefix: tuple[int, ...]) -> StepResult:
    """Run one request to completion on an idle engine; returns its first step."""
    engine.add_request(req_id, prompt, 2, 0.0, output_tokens=2, prefix=prefix)
    first = engine.step(0.0)
    assert first is not None
    while engine.step(0.0) is not None:
        pass
    return first


def test_a_cached_prefix_skips_exactly_its_prefill() -> None:
    """The second request sharing 4 blocks prefills 64 tokens fewer: TTFT lower by 64 · c."""
    cfg = config()
    engine = Engine(cfg)
    shared = (11, 12, 13, 14)
    cold = run_alone(engine, "a", 72, shared)
    warm = run_alone(engine, "b", 72, shared)
    assert cold.prefill_tokens == 72
    assert warm.prefill_tokens == 72 - 4 * BLOCK
    assert warm.first_token == ["b"]
    assert cold.duration_s == pytest.approx(cfg.step_s(72, 0, 72), abs=1e-12)
    assert warm.duration_s == pytest.approx(cfg.step_s(8, 0, 72), abs=1e-12)
    saved = cold.duration_s - warm.duration_s
    assert saved == pytest.approx(cfg.per_prefill_token_s * 4 * BLOCK, abs=1e-12)
    cache = engine.prefix_cache
    assert (cache.query_tokens, cache.hit_tokens) == (144, 64)
    assert cache.hit_rate == pytest.approx(64 / 144)


def test_the_match_stops_at_the_first_different_block() -> None:
    """Blocks after a miss are not reused even if cached: their KV depends on the missed one."""
    engine = Engine(config())
    run_alone(engine, "a", 64, (1, 2, 3, 4))
    warm = run_alone(engine, "b", 64, (1, 9, 3, 4))
    assert warm.prefill_tokens == 64 - BLOCK
    assert engine.prefix_cache.hit_tokens == BLOCK


def test_a_fully_cached_prompt_still_computes_its_last_token() -> None:
    """Every block cached: the last token is computed to sample the first output token."""
    engine = Engine(config())
    run_alone(engine, "a", 64, (1, 2, 3, 4))
    warm = run_alone(engine, "b", 64, (1, 2, 3, 4))
    assert warm.prefill_tokens == 1
    assert engine.prefix_cache.hit_tokens == 63


def test_hashes_past_the_last_full_block_are_ignored() -> None:
    """A 40-token prompt has 2 full blocks: a third hash neither caches nor hits."""
    engine = Engine(config())
    run_alone(engine, "a", 40, (1, 2, 3))
    assert sorted(engine.prefix_cache.lru_order()) == [1, 2]


def test_requests_without_hashes_never_touch_the_cache() -> None:
    """No hashes: nothing cached, nothing counted, the prompt prefilled whole each time."""
    engine = Engine(config())
    assert run_alone(engine, "a", 72, ()).prefill_tokens == 72
    assert run_alone(engine, "b", 72, ()).prefill_tokens == 72
    cache = engine.prefix_cache
    assert (len(cache), cache.query_tokens, cache.hit_tokens, cache.hit_rate) == (0, 0, 0, 0.0)


def test_the_cache_is_bounded_by_free_kv_blocks() -> None:
    """With 8 KV blocks, a 6-block prompt's blocks are trimmed to the blocks free at insert."""
    engine = Engine(config(kv_capacity_tokens=8 * BLOCK))
    engine.add_request("a", 6 * BLOCK, 2, 0.0, output_tokens=2, prefix=tuple(range(6)))
    engine.step(0.0)  # prefill: 6 blocks in use, 2 free
    assert engine.prefix_cache.lru_order() == [4, 5]
    while engine.step(0.0) is not None:
        pass  # finished: all 8 free, the prompt's blocks cached again
    assert engine.prefix_cache.lru_order() == list(range(6))


def test_lru_evicts_the_least_recently_used_block_first() -> None:
    """A match refreshes blocks; an insert past capacity evicts the oldest untouched one."""
    cache = PrefixCache()
    cache.insert([1, 2, 3], capacity=3)
    assert cache.match([1, 7]) == 1
    cache.insert([4], capacity=3)
    assert cache.lru_order() == [3, 1, 4]
    cache.trim(1)
    assert cache.lru_order() == [4]
    cache.trim(-5)
    assert len(cache) == 0


_ops = st.lists(
    st.one_of(
        st.tuples(
            st.just("insert"),
            st.lists(st.integers(0, 30), max_size=8),
            st.integers(0, 12),
        ),
        st.tuples(st.just("match"), st.lists(st.integers(0, 30), max_size=8), st.just(0)),
        st.tuples(st.just("trim"), st.just([]), st.integers(0, 12)),
    ),
    max_size=40,
)


@settings(max_examples=300, deadline=None)
@given(_ops)
def test_cache_never_exceeds_capacity_and_hits_only_inserted_blocks(
    ops: list[tuple[str, list[int], int]],
) -> None:
    """After any insert or trim the cache holds ≤ capacity; a hit is an inserted prefix."""
    cache = PrefixCache()
    inserted: set[int] = set()
    for kind, hashes, capacity in ops:
        if kind == "insert":
            cache.insert(hashes, capacity)
            inserted.update(hashes)
            assert len(cache) <= capacity
        elif kind == "trim":
            cache.trim(capacity)
            assert len(cache) <= capacity
        else:
            before = set(cache.lru_order())
            hits = cache.match(hashes)
            assert 0 <= hits <= len(hashes)
            assert set(hashes[:hits]) <= inserted
            assert set(hashes[:hits]) <= before
            assert hits == len(hashes) or hashes[hits] not in before
        assert set(cache.lru_order()) <= inserted


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(0, 3), st.integers(1, 200), st.integers(1, 30)),
        min_size=1,
        max_size=25,
    ),
    st.sampled_from([256, 1024, 4096]),
)
def test_engine_with_prefixes_completes_everything_and_counts_consistently(
    requests: list[tuple[int, int, int]], kv_tokens: int
) -> None:
    """Shared prefixes under KV pressure: every request emits its output, hits ≤ queries,
    and the cache never holds more blocks than the engine has."""
    engine = Engine(config(kv_capacity_tokens=kv_tokens, max_num_batched_tokens=128))
    emitted: dict[str, int] = {}
    for i, (system, prompt, output) in enumerate(requests):
        prompt = min(prompt, kv_tokens - output)
        hashes = tuple(system * 100 + b for b in range(prompt // BLOCK))
        engine.add_request(f"r{i}", prompt, output, 0.0, output_tokens=output, prefix=hashes)
    now = 0.0
    while (result := engine.step(now)) is not None:
        now += result.duration_s
        for rid, n in result.tokens.items():
            emitted[rid] = emitted.get(rid, 0) + n
        assert len(engine.prefix_cache) <= engine.config.num_blocks
    assert emitted == {f"r{i}": out for i, (_, _, out) in enumerate(requests)}
    cache = engine.prefix_cache
    assert 0 <= cache.hit_tokens <= cache.query_tokens
