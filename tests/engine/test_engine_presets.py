"""Engine presets: lookup, and sanity of the calibrated numbers against published figures."""

from __future__ import annotations

import statistics

import pytest

from sluicegate.engine import PRESETS, Engine, EngineConfig, preset
from tests.engine.engine_harness import Arrival, drive

KIB = 1024
GIB = 1024**3


def steady_decode_step_s(cfg: EngineConfig, batch: int, prompt_tokens: int) -> list[float]:
    """Durations of the pure-decode steps of ``batch`` requests of 256 tokens each."""
    arrivals = [Arrival(0.0, f"r{i}", prompt_tokens, 256, ignore_eos=True) for i in range(batch)]
    trace = drive(Engine(cfg), arrivals)
    return [r.duration_s for r in trace.results() if r.decode_seqs == batch]


def test_preset_lookup_returns_the_named_config() -> None:
    """preset(name) returns the entry of PRESETS."""
    assert preset("tiny") is PRESETS["tiny"]


def test_unknown_preset_error_lists_the_known_names() -> None:
    """An unknown name raises KeyError naming every known preset."""
    with pytest.raises(KeyError) as info:
        preset("gpt-5")
    for name in ("llama-3.1-8b-h100", "llama-3.1-70b-4xh100", "tiny", "independent"):
        assert name in str(info.value)


def test_8b_decode_throughput_at_batch_64_is_within_published_range() -> None:
    """Llama-3.1-8B on 1×H100 at 64 in flight decodes between Lambda's 3,400 tok/s at ~67
    in flight (vLLM v0.5.4, CPU-bound) and 8,088 tok/s at ~207 in flight (v0.6.0)."""
    durations = steady_decode_step_s(preset("llama-3.1-8b-h100"), 64, 1024)
    tokens_per_s = 64 / statistics.fmean(durations)
    assert 3_400 <= tokens_per_s <= 8_088


def test_8b_single_stream_step_is_between_the_bandwidth_floor_and_light_load_itl() -> None:
    """One decoding Llama-3.1-8B sequence on an H100 takes at least 16 GB / 3.35 TB/s
    = 4.8 ms per token, and less than the 13 ms vLLM's blog reported under light load."""
    durations = steady_decode_step_s(preset("llama-3.1-8b-h100"), 1, 1024)
    assert 16.06e9 / 3.35e12 <= min(durations) <= max(durations) <= 0.013


def test_70b_step_at_256_sequences_is_near_lambda_itl() -> None:
    """Llama-3.1-70B on 4×H100 at 256 in flight: within 25% of Lambda's 63.5 ms median ITL."""
    cfg = preset("llama-3.1-70b-4xh100")
    step_s = cfg.step_s(0, 256, 256 * 1000)
    assert 0.75 * 0.0635 <= step_s <= 1.25 * 0.0635


@pytest.mark.parametrize(
    ("name", "kv_bytes_per_token"),
    [("llama-3.1-8b-h100", 128 * KIB), ("llama-3.1-70b-4xh100", 320 * KIB)],
)
def test_kv_capacity_fits_the_memory_left_after_weights(name: str, kv_bytes_per_token: int) -> None:
    """KV tokens × bytes per token lies between 70% and 100% of the GPU memory vLLM may use
    (0.9 of 79.6 GiB per GPU) minus the BF16 weights."""
    gpus, weights_gib = {"llama-3.1-8b-h100": (1, 15.0), "llama-3.1-70b-4xh100": (4, 131.5)}[name]
    free_gib = gpus * 0.9 * 79.6 - weights_gib
    kv_gib = preset(name).kv_capacity_tokens * kv_bytes_per_token / GIB
    assert 0.7 * free_gib <= kv_gib <= free_gib


def test_tiny_serves_hundreds_of_requests_in_a_few_seconds() -> None:
    """`tiny` is fast enough for real-time demos: 300 requests of 32 tokens in under 5 s."""
    arrivals = [Arrival(0.0, f"r{i}", 64, 32, ignore_eos=True) for i in range(300)]
    trace = drive(Engine(preset("tiny")), arrivals)
    assert trace.end_of(-1) < 5.0


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_every_preset_serves_a_typical_request(name: str) -> None:
    """Each preset accepts and finishes a 1,000-token prompt with 100 output tokens."""
    trace = drive(Engine(preset(name)), [Arrival(0.0, "r", 1000, 100, ignore_eos=True)])
    assert trace.tokens_of("r") == 100


@pytest.mark.parametrize(
    ("batch", "low_s", "high_s"),
    [
        # Lambda Labs, vLLM v0.6.0, max-num-seqs 256: median TPOT 25.6 ms at ≈ 207 in flight.
        # A pure-decode step leaves out the prefill chunks of arrivals that a served TPOT
        # includes, so it may be shorter, by at most 15%.
        (207, 0.85 * 0.0256, 0.0256),
        # Light load: at least the weight-read floor (16.06 GB of BF16 weights at the full
        # 3.35 TB/s = 4.8 ms), at most the 13 ms vLLM's v0.6.0 blog gave for v0.5 with its
        # CPU overhead.
        (1, 16.06e9 / 3.35e12, 0.013),
        (4, 16.06e9 / 3.35e12, 0.013),
    ],
)
def test_8b_decode_step_at_published_operating_points(
    batch: int, low_s: float, high_s: float
) -> None:
    """The engine model's Llama-3.1-8B/H100 decode step (every step of ``batch`` sequences
    at ~1k context, run through the engine) lies within the published figures."""
    durations = steady_decode_step_s(preset("llama-3.1-8b-h100"), batch, 1000)
    assert durations
    assert low_s <= min(durations) <= max(durations) <= high_s


def test_8b_step_time_grows_with_the_batch() -> None:
    """Each sequence added to the batch lengthens every step (per-sequence compute and its
    KV reads): from ~6.6 ms alone to ~11 ms at 48 sequences of ~1.4k context, so the time
    per output token every running request sees grows with the batch."""
    cfg = preset("llama-3.1-8b-h100")
    steps = [cfg.step_s(0, batch, batch * 1400) for batch in (1, 16, 32, 48, 64)]
    assert steps == sorted(steps)
    assert steps[0] == pytest.approx(0.0066, abs=1e-4)
    assert steps[3] == pytest.approx(0.0113, abs=1e-4)
