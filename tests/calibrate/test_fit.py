"""The fit: Lawson–Hanson NNLS, and every coefficient recovered from probes that the
engine model itself timed (exactly without noise, within a few % with it)."""

from __future__ import annotations

import numpy as np
import pytest

from sluicegate.calibrate.fit import FitError, Sample, fit_samples, nnls
from sluicegate.calibrate.probe_plan import (
    decode_features,
    decode_probes,
    first_token_features,
    mean_decode_context,
    plan_probes,
    prefill_features,
)
from sluicegate.engine.engine_config import COEFFICIENTS

TRUE = {
    "base_s": 0.004, "per_prefill_token_s": 2e-6, "per_decode_seq_s": 1e-3,
    "per_kv_token_s": 2e-7, "per_prefill_attn_s": 1e-9, "request_overhead_s": 0.003,
    "response_overhead_s": 0.002,
}  # fmt: skip


def probes(noise: float = 0.0, seed: int = 0) -> list[Sample]:
    """The plan's probes for a 4-slot engine of 4,096 tokens, timed by ``TRUE`` and each
    multiplied by a log-normal factor of σ ``noise``."""
    plan = plan_probes(slots=4, context_tokens=4096, kv_capacity_tokens=4096, budget_tokens=512)
    rng = np.random.default_rng(seed)
    rows = []
    for length in plan.prefill_lengths:
        rows.append(("prefill", prefill_features(length, plan.budget_tokens)))
        rows.append(("first token", first_token_features(length, plan.budget_tokens)))
    for context, batch in decode_probes(plan):
        mean = mean_decode_context(context, plan.decode_tokens)
        rows.append(("decode", decode_features(batch, mean)))
    samples = []
    for group, features in rows:
        exact = sum(f * TRUE[name] for f, name in zip(features, COEFFICIENTS, strict=True))
        measured = exact * float(np.exp(rng.normal(0.0, noise)))
        samples.append(Sample(group, str(features), features, measured, (measured, measured), 1))
    return samples


def test_nnls_solves_a_consistent_system_and_clips_at_zero() -> None:
    """Exact on a consistent system; a coefficient least squares would make negative is 0
    and the rest solve the remaining problem."""
    a = np.array([[1.0, 0.0], [1.0, 1.0], [1.0, 2.0]])
    assert nnls(a, a @ np.array([2.0, 3.0])) == pytest.approx([2.0, 3.0], rel=1e-12)
    clipped = nnls(a, np.array([3.0, 2.0, 1.0]))  # the unconstrained slope is -1
    assert clipped[1] == 0.0
    assert clipped[0] == pytest.approx(2.0)


def test_fit_recovers_every_coefficient_without_noise() -> None:
    """Noise-free probes give back every coefficient (response overhead held fixed,
    as the calibration measures it directly)."""
    fit = fit_samples(probes(), fixed={"response_overhead_s": TRUE["response_overhead_s"]})
    for name in COEFFICIENTS:
        assert fit.coefficients[name] == pytest.approx(TRUE[name], rel=1e-6), name
    assert all(group.largest < 1e-9 for group in fit.groups)


def test_fit_predicts_within_a_few_percent_with_noise() -> None:
    """With 3% log-normal noise on every probe, the fitted model predicts each probe
    within 8% of its noise-free time and the median error stays under 3%."""
    fit = fit_samples(probes(noise=0.03), fixed={"response_overhead_s": 0.002})
    truth = probes()
    errors = [
        abs(noisy.predicted_s(fit.coefficients) / exact.measured_s - 1.0)
        for noisy, exact in zip(fit.samples, truth, strict=True)
    ]
    assert max(errors) < 0.08
    assert float(np.median(errors)) < 0.03
    assert fit.coefficients["per_decode_seq_s"] == pytest.approx(TRUE["per_decode_seq_s"], rel=0.1)
    assert fit.coefficients["request_overhead_s"] == pytest.approx(0.003, rel=0.25)


def test_fit_refuses_what_it_cannot_fit() -> None:
    """No samples, a zero time, or a fixed name that is not a coefficient."""
    with pytest.raises(FitError, match="no samples"):
        fit_samples([])
    zero = Sample("decode", "x", decode_features(1, 10.0), 0.0, (0.0, 0.0), 1)
    with pytest.raises(FitError, match="bad sample"):
        fit_samples([zero])
    with pytest.raises(FitError, match="'speed' is not one of"):
        fit_samples(probes(), fixed={"speed": 1.0})


def test_plan_spans_the_context_and_the_slots() -> None:
    """Prefill lengths from 16 to 0.9 × the context; batch sizes 1 … slots; a long decode
    context whose full batch fits the KV."""
    plan = plan_probes(slots=4, context_tokens=2048, kv_capacity_tokens=8192, budget_tokens=2048)
    assert plan.prefill_lengths[0] == 16
    assert plan.prefill_lengths[-1] == int(0.9 * 2048)
    assert plan.batch_sizes == (1, 2, 3, 4)
    long = plan.decode_contexts[-1]
    assert 4 * (long + plan.decode_tokens) <= 8192
    assert long + plan.decode_tokens <= 2048


def test_decode_probes_keep_batches_whose_prompts_prefill_in_one_step() -> None:
    """A long-context batch whose prompts exceed the step budget would decode beside the
    others' prefill chunks, so it is not probed; batch 1 always is."""
    plan = plan_probes(slots=4, context_tokens=2048, kv_capacity_tokens=8192, budget_tokens=2048)
    short, long = plan.decode_contexts
    probes_ = decode_probes(plan)
    assert [(short, b) for b in (1, 2, 3, 4)] == probes_[:4]
    assert [b for c, b in probes_ if c == long] == [b for b in (1, 2, 3, 4) if b * long <= 2048]
    assert (long, 1) in probes_
    assert (long, 4) not in probes_
