"""Per-tenant rate limits: token buckets for requests per second and tokens per minute.

Pure and clock-free: every call takes ``now`` (float seconds on any monotonic
scale). Refusals are return values — the seconds until a retry can succeed —
never exceptions.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from sluicegate.core.spec import TenantSpec

__all__ = ["TenantRateLimiter", "TokenBucket"]

_SLACK_S = 1e-6
"""Admit up to this many seconds of refill early.

A caller that retries at exactly ``now + retry_after`` must be admitted, but
``now + retry_after`` rounds (by up to ~1e-7 s for epoch-sized ``now``), which
could otherwise leave the bucket a hair short and produce a retry-after of
1e-12 s. The over-admission this allows is at most ``rate * 1e-6`` and does not
accumulate: it is carried as debt.
"""


class TokenBucket:
    """A token bucket refilled lazily at ``rate_per_s`` up to ``burst``.

    Level at time ``now``: ``min(burst, level_then + (now - then) * rate_per_s)``.
    The bucket starts full. Time never goes backwards: a ``now`` smaller than
    the latest one seen is treated as that latest one.

    A take of ``amount`` needs the bucket to hold ``min(amount, burst)``, so a
    request larger than the burst is still possible, but only from a full
    bucket; it leaves the level negative (in debt), and the debt is repaid by
    refill before anything else is admitted. Over any window of length ``T``
    the amounts admitted therefore total at most ``burst + rate_per_s * T``
    plus the largest such excess.
    """

    __slots__ = ("_burst", "_last", "_level", "_rate")

    def __init__(self, rate_per_s: float, burst: float) -> None:
        if not 0.0 < rate_per_s < math.inf:
            raise ValueError(f"rate_per_s must be in (0, inf), got {rate_per_s}")
        if not 0.0 < burst < math.inf:
            raise ValueError(f"burst must be in (0, inf), got {burst}")
        self._rate = float(rate_per_s)
        self._burst = float(burst)
        self._level = float(burst)
        # -inf makes the first refill a no-op on a full bucket, without a branch per call.
        self._last = -math.inf

    @property
    def rate_per_s(self) -> float:
        """Refill rate, in units per second."""
        return self._rate

    @property
    def burst(self) -> float:
        """Capacity: the most the bucket holds."""
        return self._burst

    def _refill(self, now: float) -> float:
        elapsed = now - self._last
        if elapsed > 0.0:
            self._last = now
            level = self._level + elapsed * self._rate
            self._level = level if level < self._burst else self._burst
        return self._level

    def level(self, now: float) -> float:
        """What the bucket holds at ``now`` (negative while in debt)."""
        return self._refill(now)

    def wait_time(self, amount: float, now: float) -> float:
        """Seconds from ``now`` until ``amount`` can be taken; 0.0 if it can be now.

        Takes nothing. Raises ``ValueError`` unless ``amount`` is in ``[0, inf)``.
        """
        if not 0.0 <= amount < math.inf:
            raise ValueError(f"amount must be in [0, inf), got {amount}")
        need = amount if amount < self._burst else self._burst
        deficit = need - self._refill(now)
        if deficit <= self._rate * _SLACK_S:
            return 0.0
        return deficit / self._rate

    def charge(self, amount: float, now: float) -> None:
        """Take ``amount`` unconditionally, going into debt if need be.

        For callers that already checked ``wait_time`` (or must bill usage that
        already happened). Raises ``ValueError`` unless ``amount`` is in ``[0, inf)``.
        """
        if not 0.0 <= amount < math.inf:
            raise ValueError(f"amount must be in [0, inf), got {amount}")
        self._refill(now)
        self._level -= amount

    def try_take(self, amount: float, now: float) -> float:
        """Take ``amount`` if the bucket holds ``min(amount, burst)``.

        Returns:
            0.0 when taken; otherwise the seconds until the bucket will hold
            enough (> 0), and nothing is taken.
        """
        wait = self.wait_time(amount, now)
        if wait == 0.0:
            self._level -= amount
        return wait

    def refund(self, amount: float, now: float) -> None:
        """Give back ``amount`` (say, tokens reserved but not used), capped at ``burst``.

        Raises ``ValueError`` unless ``amount`` is in ``[0, inf)``.
        """
        if not 0.0 <= amount < math.inf:
            raise ValueError(f"amount must be in [0, inf), got {amount}")
        level = self._refill(now) + amount
        self._level = level if level < self._burst else self._burst


class TenantRateLimiter:
    """Per-tenant request-rate and token-rate limits, charged atomically.

    Each tenant may have a request bucket (``requests_per_s``, burst
    ``burst_requests``, default ``max(1, requests_per_s)``) and a token bucket
    (``tokens_per_min / 60`` per second, burst ``burst_tokens``, default
    ``tokens_per_min``). A request is admitted only if every bucket the tenant
    has would admit it; then it is charged 1 request and its tokens. A refused
    request is charged nothing. Tenants not listed, or listed without limits,
    are always admitted. ``share`` scales every rate and burst (``tenant_buckets``):
    a replica's part of limits shared by several, when their store is down.
    """

    __slots__ = ("_buckets",)

    def __init__(self, tenants: Sequence[TenantSpec], *, share: float = 1.0) -> None:
        self._buckets: dict[str, tuple[TokenBucket | None, TokenBucket | None]] = {}
        seen: set[str] = set()
        for tenant in tenants:
            if tenant.name in seen:
                raise ValueError(f"tenant names must be unique, got {tenant.name!r} twice")
            seen.add(tenant.name)
            requests, tokens = tenant_buckets(tenant, share)
            if requests is not None or tokens is not None:
                self._buckets[tenant.name] = (requests, tokens)

    def limited(self, tenant: str) -> bool:
        """Whether ``tenant`` has any rate limit."""
        return tenant in self._buckets

    def wait_time(self, tenant: str, tokens: int, now: float) -> float:
        """Seconds until ``tenant``'s buckets would admit one request of ``tokens`` tokens:
        0.0 if they would now, else the longest wait among those that would refuse.

        Charges nothing (a check: ``charge`` takes it). Raises ``ValueError`` if ``tokens``
        is negative.
        """
        entry = self._buckets.get(tenant)
        if entry is None:
            return 0.0
        if tokens < 0:
            raise ValueError(f"tokens must be >= 0, got {tokens}")
        requests, token_bucket = entry
        wait = 0.0 if requests is None else requests.wait_time(1.0, now)
        if token_bucket is not None:
            token_wait = token_bucket.wait_time(tokens, now)
            if token_wait > wait:
                wait = token_wait
        return wait

    def charge(self, tenant: str, tokens: int, now: float) -> None:
        """Charge ``tenant`` one request and ``tokens`` tokens, unconditionally (after
        ``wait_time`` said they fit); a bucket too low goes into debt."""
        entry = self._buckets.get(tenant)
        if entry is None:
            return
        requests, token_bucket = entry
        if requests is not None:
            requests.charge(1.0, now)
        if token_bucket is not None:
            token_bucket.charge(tokens, now)

    def try_acquire(self, tenant: str, tokens: int, now: float) -> float:
        """Admit one request of ``tokens`` tokens for ``tenant`` if its buckets allow.

        Returns:
            0.0 if admitted (charged 1 request and ``tokens`` tokens); otherwise
            the retry-after seconds, the longest wait among the buckets that
            refused, and nothing is charged.

        Raises:
            ValueError: If ``tokens`` is negative.
        """
        wait = self.wait_time(tenant, tokens, now)
        if wait == 0.0:
            self.charge(tenant, tokens, now)
        return wait

    def refund(self, tenant: str, tokens: int, now: float) -> None:
        """Give back ``tokens`` charged but not used (capped at the burst).

        A non-positive ``tokens`` refunds nothing: a request that overran its
        charge is not billed again here.
        """
        entry = self._buckets.get(tenant)
        if entry is None or tokens <= 0:
            return
        token_bucket = entry[1]
        if token_bucket is not None:
            token_bucket.refund(tokens, now)


def tenant_buckets(
    tenant: TenantSpec, share: float = 1.0
) -> tuple[TokenBucket | None, TokenBucket | None]:
    """The tenant's request and token buckets (``None`` where it has no such limit), at
    ``share`` of its rates and bursts (a burst cut by the share stays at least 1)."""
    requests = tokens = None
    rate = tenant.requests_per_s
    if rate is not None:
        burst = tenant.burst_requests if tenant.burst_requests is not None else max(1.0, rate)
        requests = TokenBucket(rate * share, _share_of(burst, share))
    per_min = tenant.tokens_per_min
    if per_min is not None:
        burst = tenant.burst_tokens if tenant.burst_tokens is not None else per_min
        tokens = TokenBucket(per_min / 60.0 * share, _share_of(burst, share))
    return requests, tokens


def _share_of(burst: float, share: float) -> float:
    return max(min(1.0, burst), burst * share)
