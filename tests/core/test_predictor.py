"""Output-length and service-time predictor (core/predictor.py): learning from completions.

Synthetic workloads come from a seeded ``random.Random``, so every run sees
the same samples.
"""

from __future__ import annotations

import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sluicegate.core.predictor import Predictor
from sluicegate.core.spec import ModelSpec

SIGMA = 0.3


def fresh(
    *,
    prior_output_tokens: int = 256,
    prior_prefill_tokens_per_s: float = 8000.0,
    prior_decode_tokens_per_s: float = 40.0,
) -> Predictor:
    """A predictor with no observations, for a model with the given priors."""
    spec = ModelSpec(
        name="m",
        prior_output_tokens=prior_output_tokens,
        prior_prefill_tokens_per_s=prior_prefill_tokens_per_s,
        prior_decode_tokens_per_s=prior_decode_tokens_per_s,
    )
    return Predictor(spec)


def lognormal_output(rng: random.Random, mean: float, max_tokens: int) -> int:
    """A lognormal output length with the given mean (σ = 0.3), clipped to [1, max_tokens]."""
    mu = math.log(mean) - SIGMA**2 / 2.0
    return max(1, min(max_tokens, round(rng.lognormvariate(mu, SIGMA))))


def observe_output(
    predictor: Predictor, lane: str, max_tokens: int, completion_tokens: int
) -> None:
    """Feed one finished request that reports only its output length."""
    predictor.observe(
        lane=lane,
        max_tokens=max_tokens,
        prompt_tokens=100,
        completion_tokens=completion_tokens,
        ttft_s=None,
        duration_s=1.0,
    )


def within(value: float, target: float, tolerance: float = 0.15) -> bool:
    """Whether ``value`` is within ``tolerance`` (relative) of ``target``."""
    return abs(value - target) <= tolerance * target


def test_prior_before_enough_observations() -> None:
    """With fewer than five observations the prediction is the configured prior (capped)."""
    predictor = fresh(prior_output_tokens=300)
    for _ in range(4):
        observe_output(predictor, "chat", 1024, 20)
    assert predictor.predict_output("chat", 1024) == 300
    assert predictor.predict_output("chat", 64) == 64


def test_converges_to_distribution_mean() -> None:
    """After a few hundred lognormal outputs, the prediction is within 15% of their mean."""
    rng = random.Random(7)
    predictor = fresh()
    for _ in range(400):
        observe_output(predictor, "chat", 2048, lognormal_output(rng, 300.0, 2048))
    assert within(predictor.predict_output("chat", 2048), 300.0)


@pytest.mark.parametrize(
    ("seed", "populations"),
    [
        pytest.param(11, [("chat", 1024, 60.0), ("batch", 1024, 500.0)], id="lane"),
        pytest.param(13, [("chat", 128, 40.0), ("chat", 4096, 900.0)], id="max-tokens-bucket"),
    ],
)
def test_conditions_on_lane_and_max_tokens_bucket(
    seed: int, populations: list[tuple[str, int, float]]
) -> None:
    """Lanes are separate populations, and so, within a lane, are small and large max_tokens
    (different power-of-two buckets): each (lane, max_tokens) tracks its own mean."""
    rng = random.Random(seed)
    predictor = fresh()
    for _ in range(400):
        for lane, max_tokens, mean in populations:
            observe_output(predictor, lane, max_tokens, lognormal_output(rng, mean, max_tokens))
    for lane, max_tokens, mean in populations:
        assert within(predictor.predict_output(lane, max_tokens), mean)


def test_unseen_bucket_falls_back_to_lane() -> None:
    """A max_tokens bucket with no samples is predicted from the lane's samples."""
    rng = random.Random(17)
    predictor = fresh(prior_output_tokens=5)
    for _ in range(300):
        observe_output(predictor, "chat", 1024, lognormal_output(rng, 200.0, 1024))
    assert within(predictor.predict_output("chat", 8000), 200.0)


@settings(max_examples=100, deadline=None)
@given(
    history=st.lists(
        st.tuples(st.sampled_from(["a", "b"]), st.integers(1, 8192), st.integers(0, 8192)),
        max_size=60,
    ),
    lane=st.sampled_from(["a", "b", "c"]),
    max_tokens=st.integers(1, 8192),
)
def test_prediction_never_exceeds_max_tokens(
    history: list[tuple[str, int, int]], lane: str, max_tokens: int
) -> None:
    """Whatever was observed, 1 ≤ predict_output(lane, max_tokens) ≤ max_tokens."""
    predictor = fresh()
    for seen_lane, seen_max, output in history:
        observe_output(predictor, seen_lane, seen_max, output)
    assert 1 <= predictor.predict_output(lane, max_tokens) <= max_tokens


def test_prediction_capped_within_shared_bucket() -> None:
    """max_tokens 2047 and 1024 share a bucket; long outputs learnt at 2047 are capped at 1024."""
    predictor = fresh()
    for _ in range(50):
        observe_output(predictor, "chat", 2047, 1900)
    assert predictor.predict_output("chat", 2047) == pytest.approx(1900, rel=0.01)
    assert predictor.predict_output("chat", 1024) == 1024


PREFILL_BASE_S = 0.04
PREFILL_S_PER_TOKEN = 1.0 / 6000.0
DECODE_S_PER_TOKEN = 0.02


def observe_timed(predictor: Predictor, rng: random.Random) -> None:
    """One request whose ttft and duration follow the true model above, with noise."""
    prompt = rng.randint(100, 4000)
    output = rng.randint(20, 400)
    ttft = PREFILL_BASE_S + prompt * PREFILL_S_PER_TOKEN + rng.gauss(0.0, 0.003)
    decode = (output - 1) * DECODE_S_PER_TOKEN * (1.0 + rng.gauss(0.0, 0.05))
    predictor.observe(
        lane="chat",
        max_tokens=512,
        prompt_tokens=prompt,
        completion_tokens=output,
        ttft_s=ttft,
        duration_s=ttft + decode,
    )


def test_fits_prefill_base_and_slope() -> None:
    """prefill_s(p) ≈ base + p·slope, fitted from noisy time-to-first-token samples."""
    rng = random.Random(23)
    predictor = fresh(prior_prefill_tokens_per_s=100_000.0)
    for _ in range(300):
        observe_timed(predictor, rng)
    base = predictor.prefill_s(0)
    slope = (predictor.prefill_s(3000) - base) / 3000
    assert within(base, PREFILL_BASE_S, 0.1)
    assert within(slope, PREFILL_S_PER_TOKEN, 0.05)


def test_fits_decode_rate() -> None:
    """decode_s_per_token ≈ (duration − ttft) / (output − 1), averaged over completions."""
    rng = random.Random(29)
    predictor = fresh(prior_decode_tokens_per_s=1000.0)
    for _ in range(300):
        observe_timed(predictor, rng)
    assert within(predictor.decode_s_per_token(), DECODE_S_PER_TOKEN, 0.1)


def test_service_time_uses_priors_before_data() -> None:
    """Before any timed sample: prefill = p / prior_prefill_rate, decode = 1 / prior_decode_rate."""
    predictor = fresh(prior_prefill_tokens_per_s=8000.0, prior_decode_tokens_per_s=40.0)
    assert predictor.prefill_s(800) == pytest.approx(0.1)
    assert predictor.decode_s_per_token() == pytest.approx(1.0 / 40.0)
