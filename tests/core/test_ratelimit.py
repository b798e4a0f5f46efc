"""Token buckets and per-tenant rate limits: refill math, retry-after, atomicity."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sluicegate.core.ratelimit import TenantRateLimiter, TokenBucket, tenant_buckets
from sluicegate.core.spec import TenantSpec


def _drained(rate_per_s: float = 2.0, burst: float = 10.0) -> TokenBucket:
    bucket = TokenBucket(rate_per_s, burst)
    assert bucket.try_take(burst, 0.0) == 0.0
    return bucket


def test_bucket_starts_full() -> None:
    """A new bucket holds its burst at whatever time it is first asked."""
    assert TokenBucket(2.0, 10.0).level(123.0) == 10.0


def test_bucket_refills_at_rate() -> None:
    """Level at now is the level then plus elapsed * rate."""
    bucket = _drained(rate_per_s=2.0, burst=10.0)
    assert bucket.level(1.5) == 3.0
    assert bucket.level(4.0) == 8.0


def test_bucket_refill_is_capped_at_burst() -> None:
    """However long it idles, the bucket holds at most its burst."""
    bucket = _drained(rate_per_s=2.0, burst=10.0)
    assert bucket.level(1000.0) == 10.0


def test_bucket_ignores_time_going_backwards() -> None:
    """A now earlier than the latest one seen neither refills nor drains the bucket."""
    bucket = _drained(rate_per_s=2.0, burst=10.0)
    assert bucket.level(3.0) == 6.0
    assert bucket.level(1.0) == 6.0
    assert bucket.level(4.0) == 8.0


def test_take_succeeds_and_debits_when_enough() -> None:
    """A take the bucket can cover returns 0.0 and removes the amount."""
    bucket = TokenBucket(2.0, 10.0)
    assert bucket.try_take(4.0, 0.0) == 0.0
    assert bucket.level(0.0) == 6.0


def test_retry_after_is_exact_time_until_enough() -> None:
    """A refused take returns (needed - level) / rate seconds."""
    bucket = _drained(rate_per_s=4.0, burst=10.0)
    assert bucket.try_take(6.0, 0.5) == pytest.approx(1.0)


def test_refused_take_takes_nothing() -> None:
    """A refusal leaves the level unchanged."""
    bucket = _drained(rate_per_s=4.0, burst=10.0)
    bucket.try_take(6.0, 0.5)
    assert bucket.level(0.5) == 2.0


@pytest.mark.parametrize("start", [0.0, 1.7e9 + 0.123])
def test_retry_at_retry_after_is_admitted(start: float) -> None:
    """Retrying at exactly now + retry_after succeeds, even at epoch-sized times."""
    bucket = TokenBucket(3.0, 10.0)
    assert bucket.try_take(10.0, start) == 0.0
    wait = bucket.try_take(7.0, start + 0.1)
    assert wait > 0.0
    assert bucket.try_take(7.0, start + 0.1 + wait) == 0.0


def test_refund_adds_back() -> None:
    """A refund returns the amount to the bucket."""
    bucket = TokenBucket(2.0, 10.0)
    bucket.try_take(5.0, 0.0)
    bucket.refund(3.0, 0.0)
    assert bucket.level(0.0) == 8.0


def test_refund_is_capped_at_burst() -> None:
    """Refunding more than was taken fills the bucket only to its burst."""
    bucket = TokenBucket(2.0, 10.0)
    bucket.try_take(2.0, 0.0)
    bucket.refund(50.0, 0.0)
    assert bucket.level(0.0) == 10.0


def test_oversized_take_from_full_bucket_goes_into_debt() -> None:
    """A take above the burst succeeds from a full bucket and leaves it negative."""
    bucket = TokenBucket(2.0, 10.0)
    assert bucket.try_take(15.0, 0.0) == 0.0
    assert bucket.level(0.0) == -5.0


def test_oversized_take_waits_for_a_full_bucket() -> None:
    """A take above the burst from a partly drained bucket waits until it is full."""
    bucket = TokenBucket(2.0, 10.0)
    bucket.try_take(1.0, 0.0)
    assert bucket.try_take(15.0, 0.0) == pytest.approx(0.5)


def test_debt_is_repaid_before_the_next_take() -> None:
    """After an oversized take, even a small take waits for the debt to refill."""
    bucket = TokenBucket(2.0, 10.0)
    bucket.try_take(15.0, 0.0)
    assert bucket.try_take(1.0, 0.0) == pytest.approx(3.0)


@pytest.mark.parametrize(
    ("rate_per_s", "burst", "message"),
    [
        (0.0, 1.0, r"rate_per_s must be in \(0, inf\)"),
        (math.nan, 1.0, r"rate_per_s must be in \(0, inf\)"),
        (1.0, -1.0, r"burst must be in \(0, inf\)"),
        (1.0, math.inf, r"burst must be in \(0, inf\)"),
    ],
)
def test_bucket_rejects_bad_settings(rate_per_s: float, burst: float, message: str) -> None:
    """Rate and burst must be positive and finite; the message gives the range."""
    with pytest.raises(ValueError, match=message):
        TokenBucket(rate_per_s, burst)


@pytest.mark.parametrize("amount", [-1.0, math.nan, math.inf])
def test_bucket_rejects_bad_amounts(amount: float) -> None:
    """Takes and refunds must be in [0, inf)."""
    bucket = TokenBucket(1.0, 1.0)
    with pytest.raises(ValueError, match=r"amount must be in \[0, inf\)"):
        bucket.try_take(amount, 0.0)
    with pytest.raises(ValueError, match=r"amount must be in \[0, inf\)"):
        bucket.refund(amount, 0.0)


def _limiter(**limits: float) -> TenantRateLimiter:
    return TenantRateLimiter([TenantSpec.model_validate({"name": "acme", **limits})])


def test_unknown_tenant_is_always_admitted() -> None:
    """A tenant the limiter does not know has no limits."""
    limiter = _limiter(requests_per_s=1.0)
    assert all(limiter.try_acquire("other", 10**9, 0.0) == 0.0 for _ in range(100))


def test_tenant_without_limits_is_always_admitted() -> None:
    """A listed tenant with no rate settings is never refused."""
    limiter = _limiter()
    assert not limiter.limited("acme")
    assert all(limiter.try_acquire("acme", 10**9, 0.0) == 0.0 for _ in range(100))


def test_request_burst_defaults_to_rate_but_at_least_one() -> None:
    """Without burst_requests the request bucket holds max(1, requests_per_s)."""
    slow = _limiter(requests_per_s=0.5)
    assert slow.try_acquire("acme", 0, 0.0) == 0.0
    assert slow.try_acquire("acme", 0, 0.0) == pytest.approx(2.0)
    fast = _limiter(requests_per_s=5.0)
    assert [fast.try_acquire("acme", 0, 0.0) == 0.0 for _ in range(6)] == [True] * 5 + [False]


def test_token_burst_defaults_to_tokens_per_min() -> None:
    """Without burst_tokens the token bucket holds a minute's tokens, refilled per second."""
    limiter = _limiter(tokens_per_min=600.0)
    assert limiter.try_acquire("acme", 600, 0.0) == 0.0
    assert limiter.try_acquire("acme", 20, 0.0) == pytest.approx(2.0)


def test_refusal_by_tokens_does_not_consume_a_request() -> None:
    """A request the token bucket refuses leaves the request bucket untouched."""
    limiter = _limiter(
        requests_per_s=1.0, burst_requests=2.0, tokens_per_min=60.0, burst_tokens=100.0
    )
    assert limiter.try_acquire("acme", 100, 0.0) == 0.0
    assert limiter.try_acquire("acme", 50, 0.0) == pytest.approx(50.0)
    assert limiter.try_acquire("acme", 0, 0.0) == 0.0
    assert limiter.try_acquire("acme", 0, 0.0) == pytest.approx(1.0)


def test_refusal_by_requests_does_not_consume_tokens() -> None:
    """A request the request bucket refuses leaves the token bucket untouched."""
    limiter = _limiter(requests_per_s=1.0, tokens_per_min=60.0, burst_tokens=10.0)
    assert limiter.try_acquire("acme", 5, 0.0) == 0.0
    assert limiter.try_acquire("acme", 5, 0.0) == pytest.approx(1.0)
    assert limiter.try_acquire("acme", 10, 5.0) == 0.0


def test_retry_after_is_the_longest_refusing_wait() -> None:
    """When both buckets refuse, retry-after is the larger of their waits."""
    limiter = _limiter(requests_per_s=1.0, tokens_per_min=60.0, burst_tokens=10.0)
    limiter.try_acquire("acme", 10, 0.0)
    assert limiter.try_acquire("acme", 4, 0.0) == pytest.approx(4.0)


def test_tenant_refund_returns_unused_tokens() -> None:
    """Refunded tokens can be spent again at once."""
    limiter = _limiter(tokens_per_min=60.0, burst_tokens=10.0)
    limiter.try_acquire("acme", 10, 0.0)
    limiter.refund("acme", 6, 0.0)
    assert limiter.try_acquire("acme", 6, 0.0) == 0.0
    assert limiter.try_acquire("acme", 1, 0.0) > 0.0


def test_tenant_refund_of_negative_tokens_charges_nothing() -> None:
    """A negative refund (usage above the charge) is ignored, not billed."""
    limiter = _limiter(tokens_per_min=60.0, burst_tokens=10.0)
    limiter.refund("acme", -5, 0.0)
    assert limiter.try_acquire("acme", 10, 0.0) == 0.0


def test_limiter_rejects_duplicate_tenants() -> None:
    """Two tenants with one name are a configuration error."""
    tenant = TenantSpec.model_validate({"name": "acme", "requests_per_s": 1.0})
    with pytest.raises(ValueError, match="unique"):
        TenantRateLimiter([tenant, tenant])


_step = st.tuples(
    st.one_of(st.just(-1.0), st.floats(min_value=0.0, max_value=3.0)),
    st.integers(min_value=0, max_value=50),
)


@settings(max_examples=150, deadline=None)
@given(
    rate=st.floats(min_value=0.1, max_value=20.0),
    burst=st.floats(min_value=1.0, max_value=20.0),
    steps=st.lists(_step, min_size=1, max_size=120),
)
def test_admitted_requests_in_any_window_fit_burst_plus_rate(
    rate: float, burst: float, steps: list[tuple[float, int]]
) -> None:
    """Admissions in any window of length T number at most burst + rate * T.

    A step with delay -1 retries at exactly the last retry-after, the edge case.
    The slack is the documented 1e-6 s of early admission plus float rounding.
    """
    limiter = _limiter(requests_per_s=rate, burst_requests=burst, tokens_per_min=3000.0)
    now, last_wait, admitted = 0.0, 0.0, []
    for delay, tokens in steps:
        now += last_wait if delay < 0 else delay
        last_wait = limiter.try_acquire("acme", tokens, now)
        if last_wait == 0.0:
            admitted.append(now)
    for i, start in enumerate(admitted):
        for j in range(i, len(admitted)):
            window = admitted[j] - start
            assert j - i + 1 <= burst + rate * (window + 1e-6) + 1e-9


def test_share_scales_rates_and_bursts_keeping_a_burst_of_one() -> None:
    """``share`` (a replica's part while the shared store is down) scales each rate and
    burst; a burst cut below 1 stays 1, and share 1 changes nothing."""
    tenant = TenantSpec(name="t", requests_per_s=4.0, burst_requests=1.5, tokens_per_min=600.0)
    requests, tokens = tenant_buckets(tenant, 0.5)
    assert requests is not None
    assert tokens is not None
    assert (requests.rate_per_s, requests.burst) == (2.0, 1.0)
    assert (tokens.rate_per_s, tokens.burst) == (5.0, 300.0)
    whole_requests, whole_tokens = tenant_buckets(tenant)
    assert whole_requests is not None
    assert whole_tokens is not None
    assert (whole_requests.rate_per_s, whole_requests.burst) == (4.0, 1.5)
    assert (whole_tokens.rate_per_s, whole_tokens.burst) == (10.0, 600.0)
