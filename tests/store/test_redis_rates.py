"""Global tenant token buckets: ``take`` is ``core.ratelimit`` on Redis time, across replicas."""

from __future__ import annotations

import asyncio
import uuid

import pytest
import redis.asyncio as aioredis
from hypothesis import given, settings
from hypothesis import strategies as st

from sluicegate.core.ratelimit import TenantRateLimiter
from sluicegate.core.spec import TenantSpec
from sluicegate.store.keys import rate_key
from sluicegate.store.redis_store import RedisStore
from sluicegate.store.types import Refund, TenantRates
from tests.store.redis_server import RedisServer
from tests.store.store_helpers import connected_stores, model_limits


def _rates(spec: TenantSpec) -> TenantRates:
    """The ``TenantRates`` the gateway derives from ``spec`` (the core's defaults for bursts)."""
    rps, per_min = spec.requests_per_s, spec.tokens_per_min
    return TenantRates(
        tenant=spec.name,
        requests_per_s=rps,
        burst_requests=spec.burst_requests or max(1.0, rps or 1.0),
        tokens_per_s=None if per_min is None else per_min / 60.0,
        burst_tokens=spec.burst_tokens or per_min or 1.0,
    )


async def _redis_now(client: aioredis.Redis, spec: TenantSpec) -> float:
    """The Redis time the last ``take`` used: both buckets store it as their refill time."""
    field = "rt" if spec.requests_per_s is not None else "tt"
    return float(await client.hget(rate_key("sluicegate", spec.name), field))


async def _compare(url: str, drawn: TenantSpec, steps: list[tuple[float, int]]) -> None:
    # A fresh name per run: Hypothesis replays examples, and Redis keeps the buckets.
    spec = drawn.model_copy(update={"name": str(uuid.uuid4())})
    limiter = TenantRateLimiter([spec])
    async with (
        connected_stores(url, "a") as (store,),
        aioredis.Redis.from_url(url, decode_responses=True) as client,
    ):
        for pause_s, tokens in steps:
            await asyncio.sleep(pause_s)
            wait = await store.take(_rates(spec), tokens)
            now = await _redis_now(client, spec)
            assert wait == limiter.try_acquire(spec.name, tokens, now), (pause_s, tokens)


tenant_specs = st.builds(
    TenantSpec,
    name=st.just("drawn"),
    requests_per_s=st.none() | st.floats(20.0, 400.0),
    burst_requests=st.none() | st.floats(1.0, 4.0),
    tokens_per_min=st.none() | st.floats(6_000.0, 120_000.0),
    burst_tokens=st.none() | st.floats(1.0, 500.0),
).filter(lambda spec: spec.requests_per_s is not None or spec.tokens_per_min is not None)


@settings(max_examples=25, deadline=None)
@given(
    spec=tenant_specs,
    steps=st.lists(
        st.tuples(st.sampled_from([0.0, 0.001, 0.004, 0.015]), st.integers(0, 700)),
        min_size=1,
        max_size=12,
    ),
)
def test_take_agrees_with_the_core_limiter(
    redis_server: RedisServer, spec: TenantSpec, steps: list[tuple[float, int]]
) -> None:
    """Same tenant, same sequence, same times (Redis's): exactly the core's waits.

    The script does the core's double arithmetic on the same inputs in the same
    order (levels and times are stored with 17 significant digits, which round
    trip exactly), so the waits are equal, not merely close.
    """
    asyncio.run(_compare(redis_server.url, spec, steps))


async def test_replicas_together_admit_at_most_rate_times_time_plus_burst(redis_url: str) -> None:
    """3 stores hammer one tenant for 1 s: admitted ≤ burst + rate × elapsed (Redis time)."""
    rates = TenantRates(
        "hot", requests_per_s=50.0, burst_requests=5.0, tokens_per_s=None, burst_tokens=1.0
    )
    admitted = 0

    async def hammer(store: RedisStore, until: float) -> None:
        nonlocal admitted
        while asyncio.get_running_loop().time() < until:
            wait = await store.take(rates, 0)
            if wait == 0.0:
                admitted += 1
            else:
                await asyncio.sleep(min(wait, 0.003))

    async with (
        connected_stores(redis_url, "a", "b", "c") as stores,
        aioredis.Redis.from_url(redis_url) as client,
    ):
        seconds, micros = await client.time()
        started = seconds + micros / 1e6
        until = asyncio.get_running_loop().time() + 1.0
        await asyncio.gather(*(hammer(store, until) for store in stores))
        seconds, micros = await client.time()
        elapsed = seconds + micros / 1e6 - started
    # The core's 1 µs slack may admit rate × 1e-6 early per take: far below one request.
    assert admitted <= 5.0 + 50.0 * elapsed + 1e-3
    # Not vacuous: the stores keep the bucket drained (a stalled loop may lose some).
    assert admitted >= 0.8 * 50.0 * elapsed


async def test_refused_takes_charge_nothing_and_refunds_cap_at_the_burst(redis_url: str) -> None:
    """A refusal leaves the buckets; a refund returns tokens, never past the burst."""
    tenant = f"t-{uuid.uuid4()}"
    rates = TenantRates(tenant, None, 1.0, tokens_per_s=1.0, burst_tokens=100.0)
    async with connected_stores(redis_url, "a") as (store,):
        assert await store.take(rates, 80) == 0.0
        wait = await store.take(rates, 50)
        assert 29.0 < wait <= 30.0
        assert await store.take(rates, 20) == 0.0
        await store.sync([(model_limits(1), [Refund(rates, 1000)])])
        assert await store.take(rates, 100) == 0.0
        assert await store.take(rates, 1) > 0.9


async def test_unlimited_tenant_needs_no_round_trip(redis_url: str) -> None:
    """Without rates, ``take`` admits even when the store is not connected."""
    store = RedisStore(redis_url, replica="a")
    assert await store.take(TenantRates("free", None, 1.0, None, 1.0), 10**6) == 0.0
    with pytest.raises(ValueError, match="tokens"):
        await store.take(TenantRates("free", 1.0, 1.0, None, 1.0), -1)
