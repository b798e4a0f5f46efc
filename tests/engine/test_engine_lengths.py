"""Seeded output lengths: deterministic, prompt-dependent, capped."""

from __future__ import annotations

import math
import statistics

import pytest

from sluicegate.engine import (
    DEFAULT_LENGTH_MODEL,
    Engine,
    OutputLengthModel,
    draw_output_tokens,
    preset,
    request_normal,
    resolve_output_tokens,
)


def test_draw_is_a_pure_function_of_seed_request_and_prompt() -> None:
    """The same (seed, req_id, prompt) always gives the same length, in any engine."""
    first = [draw_output_tokens(5, f"r{i}", 100, 4096) for i in range(50)]
    again = [draw_output_tokens(5, f"r{i}", 100, 4096) for i in range(50)]
    engine = Engine(preset("tiny"), seed=5)
    planned = [engine.planned_output_tokens(f"r{i}", 100, 4096) for i in range(50)]
    assert first == again == planned


def test_draw_changes_with_the_seed() -> None:
    """A different engine seed gives different lengths for most requests."""
    a = [draw_output_tokens(1, f"r{i}", 100, 4096) for i in range(50)]
    b = [draw_output_tokens(2, f"r{i}", 100, 4096) for i in range(50)]
    assert sum(x != y for x, y in zip(a, b, strict=True)) > 40


def test_draws_stay_within_one_and_max_tokens() -> None:
    """Draws are clamped to [1, max_tokens]; a small cap is often hit."""
    draws = [draw_output_tokens(0, f"r{i}", 50, 20) for i in range(500)]
    assert min(draws) >= 1
    assert max(draws) == 20


def test_mean_draw_matches_the_lognormal_mean() -> None:
    """Uncapped, the sample mean is within 10% of median·exp(σ²/2) (≈181 at a 200-token prompt)."""
    draws = [draw_output_tokens(0, f"r{i}", 200, 10**9) for i in range(4000)]
    expected = DEFAULT_LENGTH_MODEL.median_tokens * math.exp(DEFAULT_LENGTH_MODEL.sigma**2 / 2)
    assert statistics.fmean(draws) == pytest.approx(expected, rel=0.10)


def test_median_grows_with_the_prompt() -> None:
    """Longer prompts draw longer answers in the median."""
    assert DEFAULT_LENGTH_MODEL.median_for(2000) > DEFAULT_LENGTH_MODEL.median_for(200)


def test_ignore_eos_means_max_tokens() -> None:
    """With ignore_eos the output length is max_tokens, whatever else is given."""
    assert resolve_output_tokens(0, "r", 10, 77, output_tokens=3, ignore_eos=True) == 77


def test_trace_output_length_is_capped_and_at_least_one() -> None:
    """A replayed output length is clamped to [1, max_tokens]."""
    assert resolve_output_tokens(0, "r", 10, 50, output_tokens=80) == 50
    assert resolve_output_tokens(0, "r", 10, 50, output_tokens=0) == 1


def test_request_normal_looks_standard_normal() -> None:
    """Deviates over many requests have mean ≈ 0 and standard deviation ≈ 1, and are finite."""
    values = [request_normal(s, f"r{i}", 100) for s in range(10) for i in range(400)]
    assert all(math.isfinite(v) for v in values)
    assert statistics.fmean(values) == pytest.approx(0.0, abs=0.05)
    assert statistics.stdev(values) == pytest.approx(1.0, abs=0.05)


def test_length_model_rejects_out_of_range_parameters() -> None:
    """Length-model validation names the parameter and its range."""
    with pytest.raises(ValueError, match=r"sigma must be in \[0, 5\]"):
        OutputLengthModel(sigma=-1.0)
