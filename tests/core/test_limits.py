"""Adaptive concurrency limits: each mode's rule (what every mode must do is in
test_conformance.py)."""

from __future__ import annotations

import pytest

from sluicegate.core.limits import Limit, SampleKind, make_limit
from sluicegate.core.limits.gradient import GradientLimit
from sluicegate.core.spec import AdaptiveSpec

BASELINE_S = 0.2
FIRST = SampleKind.FIRST_TOKEN


def _limit(mode: str, cap: int = 64, **settings_: object) -> Limit:
    return make_limit(AdaptiveSpec.model_validate({"mode": mode, **settings_}), cap)


def _kv(limit: Limit, usage: float, inflight: int) -> int:
    """One KV-cache reading; the limit after it."""
    limit.on_kv_usage(usage, inflight=inflight)
    return limit.value


def _loaded_samples(limit: Limit, rtt_s: float, count: int, kind: SampleKind = FIRST) -> None:
    for _ in range(count):
        limit.on_success(rtt_s, inflight=limit.value, kind=kind)


def test_kv_cache_falls_multiplicatively_above_high_water() -> None:
    """Above high water each reading sets L = floor(L * decrease)."""
    limit = _limit("kv_cache", cap=100, decrease=0.5)
    assert _kv(limit, 0.95, 100) == 50
    assert _kv(limit, 0.95, 50) == 25


def test_kv_cache_always_drops_by_at_least_one_until_floor() -> None:
    """A small limit still shrinks by one per high reading, and stops at the floor."""
    limit = _limit("kv_cache", cap=3, floor=2, decrease=0.9)
    assert _kv(limit, 0.99, 3) == 2
    assert _kv(limit, 0.99, 2) == 2


def test_kv_cache_recovers_additively_below_low_water() -> None:
    """Below low water each reading adds ``increase``, up to the cap."""
    limit = _limit("kv_cache", cap=20, decrease=0.5, increase=3)
    assert _kv(limit, 0.95, 20) == 10
    assert _kv(limit, 0.1, 10) == 13
    for _ in range(10):
        limit.on_kv_usage(0.1, inflight=10)
    assert limit.value == 20


def test_kv_cache_holds_between_watermarks() -> None:
    """A reading between the watermarks leaves the limit where it is."""
    limit = _limit("kv_cache", cap=20, decrease=0.5)
    limit.on_kv_usage(0.95, inflight=20)
    assert _kv(limit, 0.8, 10) == 10


def test_kv_cache_ignores_latency_samples() -> None:
    """Latency samples, even drops, do not move a kv_cache limit."""
    limit = _limit("kv_cache", cap=20)
    limit.on_dropped(inflight=20)
    limit.on_success(100.0, inflight=20, kind=FIRST)
    assert limit.value == 20


def test_gradient_falls_when_ttft_triples_under_load() -> None:
    """With TTFT at 3x its long-run level, the limit shrinks well below the cap."""
    limit = _limit("latency", cap=100)
    _loaded_samples(limit, BASELINE_S, 100)
    assert limit.value == 100
    _loaded_samples(limit, 3 * BASELINE_S, 30)
    assert limit.value < 50


def test_gradient_recovers_when_ttft_returns_to_baseline() -> None:
    """After the slow spell ends, baseline samples grow the limit back to the cap."""
    limit = _limit("latency", cap=100)
    _loaded_samples(limit, BASELINE_S, 100)
    _loaded_samples(limit, 3 * BASELINE_S, 30)
    dipped = limit.value
    _loaded_samples(limit, BASELINE_S, 300)
    assert dipped < 50
    assert limit.value == 100


def test_gradient_holds_while_app_limited() -> None:
    """With fewer than L/2 requests in flight, slow samples do not move the limit."""
    limit = _limit("latency", cap=100)
    _loaded_samples(limit, BASELINE_S, 50)
    for _ in range(50):
        limit.on_success(10 * BASELINE_S, inflight=49, kind=FIRST)
    assert limit.value == 100


def test_gradient_drop_lowers_even_a_small_limit() -> None:
    """A drop multiplies the estimate by 1 - smoothing/2 (0.9), where a sample at twice the
    long RTT would not move a limit of 8 at all (its sqrt(L) allowance outweighs g = 0.75)."""
    limit = _limit("latency", cap=8)
    _loaded_samples(limit, BASELINE_S, 20)
    limit.on_dropped(inflight=8)
    assert limit.value == 7  # 8 * 0.9 = 7.2
    limit.on_dropped(inflight=7)
    assert limit.value == 6  # 7.2 * 0.9 = 6.48


def test_gradient_drop_counts_whatever_the_load_and_before_any_sample() -> None:
    """A drop is evidence by itself: it lowers the limit with nothing in flight and before
    any latency sample, and leaves the long RTT alone."""
    limit = _gradient(smoothing=0.5)
    limit.on_dropped(inflight=0)
    assert limit.value == 75  # 100 * (1 - 0.5 / 2)
    assert limit.long_rtt_s is None
    _loaded_samples(limit, BASELINE_S, 3)
    long = limit.long_rtt_s
    limit.on_dropped(inflight=0)
    assert limit.long_rtt_s == long


def test_gradient_drops_reach_the_floor() -> None:
    """Repeated drops walk the limit down to the floor and no further."""
    limit = _limit("latency", cap=16, floor=3)
    for _ in range(100):
        limit.on_dropped(inflight=1)
    assert limit.value == 3


def test_gradient_compares_each_sample_kind_with_its_own_history() -> None:
    """Streams' time to first token (0.2 s) and unary answers' time per output token
    (0.02 s), interleaved under load, leave the limit at its cap: one shared history would
    sit between the two and read every first-token sample as congestion."""
    limit = _limit("latency", cap=8, tolerance=1.0)
    for _ in range(50):
        _loaded_samples(limit, BASELINE_S, 1, SampleKind.FIRST_TOKEN)
        _loaded_samples(limit, BASELINE_S / 10, 1, SampleKind.PER_OUTPUT_TOKEN)
    assert limit.value == 8
    gradient = _gradient()
    _loaded_samples(gradient, 0.3, 2, SampleKind.PER_OUTPUT_TOKEN)
    assert gradient.long_rtt_s is None
    assert gradient.long_rtt_of(SampleKind.PER_OUTPUT_TOKEN) == pytest.approx(0.3)


def test_gradient_falls_when_time_per_output_token_triples_under_load() -> None:
    """Unary answers' time per output token moves the limit as time to first token does."""
    limit = _limit("latency", cap=100)
    _loaded_samples(limit, BASELINE_S / 10, 100, SampleKind.PER_OUTPUT_TOKEN)
    assert limit.value == 100
    _loaded_samples(limit, 3 * BASELINE_S / 10, 30, SampleKind.PER_OUTPUT_TOKEN)
    assert limit.value < 50


def _gradient(**settings_: object) -> GradientLimit:
    return GradientLimit(AdaptiveSpec.model_validate({"mode": "latency", **settings_}), 100)


def test_gradient_long_rtt_is_the_mean_while_warming_up() -> None:
    """Before 1/alpha samples the long RTT is the plain mean of the samples so far."""
    limit = _gradient(long_window=600)
    for rtt_s in (0.1, 0.2, 0.6):
        limit.on_success(rtt_s, inflight=0, kind=FIRST)
    assert limit.long_rtt_s == pytest.approx(0.3)


@pytest.mark.parametrize(
    ("sample_s", "long_rtt_s"),
    [
        pytest.param(0.6, 0.8, id="exponential-average"),
        pytest.param(0.2, 0.6 * 0.95, id="decays-when-far-above-the-sample"),
    ],
)
def test_gradient_long_rtt_after_warm_up(sample_s: float, long_rtt_s: float) -> None:
    """Once warm, each sample moves the long RTT by alpha = 2/(window+1) of the gap; when
    long/short exceeds 2 the stored long RTT is also multiplied by 0.95."""
    limit = _gradient(long_window=3)
    for _ in range(5):
        limit.on_success(1.0, inflight=0, kind=FIRST)
    limit.on_success(sample_s, inflight=0, kind=FIRST)
    assert limit.long_rtt_s == pytest.approx(long_rtt_s)


def test_gradient_ignores_kv_usage() -> None:
    """KV readings do not move a latency limit."""
    limit = _limit("latency", cap=20)
    assert _kv(limit, 1.0, 20) == 20


def test_aimd_decreases_on_drop() -> None:
    """A dropped request sets L = floor(L * decrease)."""
    limit = _limit("aimd", cap=50, decrease=0.5)
    limit.on_dropped(inflight=50)
    assert limit.value == 25


def test_aimd_decreases_on_timeout() -> None:
    """A sample slower than timeout_s counts as a drop."""
    limit = _limit("aimd", cap=50, decrease=0.5, timeout_s=1.0)
    limit.on_success(1.5, inflight=50, kind=FIRST)
    assert limit.value == 25


def test_aimd_drop_costs_at_least_one_slot_at_the_default_decrease() -> None:
    """With the default decrease (0.9) a drop takes floor(0.9 L), or at least one, down to
    the floor: 8 → 7 → 6 → 5 → 4 → 3 → 2 → 1."""
    limit = _limit("aimd", cap=8)
    seen = []
    for _ in range(8):
        limit.on_dropped(inflight=0)
        seen.append(limit.value)
    assert seen == [7, 6, 5, 4, 3, 2, 1, 1]


def test_aimd_timeout_judges_only_time_to_first_token() -> None:
    """A unary answer's time per output token above timeout_s is a success, not a drop; a
    time to first token above it is a drop."""
    limit = _limit("aimd", cap=50, decrease=0.5, timeout_s=1.0)
    limit.on_dropped(inflight=50)
    limit.on_success(3.0, inflight=25, kind=SampleKind.PER_OUTPUT_TOKEN)
    assert limit.value == 26
    limit.on_success(3.0, inflight=26, kind=SampleKind.FIRST_TOKEN)
    assert limit.value == 13


def test_aimd_increases_under_load() -> None:
    """A good sample with inflight*2 >= L adds ``increase``."""
    limit = _limit("aimd", cap=50, decrease=0.5, increase=2)
    limit.on_dropped(inflight=50)
    limit.on_success(0.1, inflight=13, kind=FIRST)
    assert limit.value == 27


def test_aimd_holds_when_app_limited() -> None:
    """A good sample with inflight*2 < L leaves the limit unchanged."""
    limit = _limit("aimd", cap=50, decrease=0.5)
    limit.on_dropped(inflight=50)
    limit.on_success(0.1, inflight=12, kind=FIRST)
    assert limit.value == 25


def test_aimd_ignores_kv_usage() -> None:
    """KV readings do not move an AIMD limit."""
    limit = _limit("aimd", cap=20)
    assert _kv(limit, 1.0, 20) == 20
