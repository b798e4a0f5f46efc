"""Retries applied once and sessions fenced: a sync sent again under its number is answered
again and applied never twice, an older one is refused (stale), a new session starts its
numbers afresh, a take sent again with its request id charges the tenant once, and a
session the store no longer knows (restarted empty, or reaped) is told so."""

from __future__ import annotations

import asyncio

import pytest
import redis.asyncio as aioredis

from sluicegate.store.store_errors import StoreSessionLostError, StoreUnavailableError
from sluicegate.store.types import Drop, Lease, TenantRates
from tests.store.store_helpers import connected_stores, model_limits, offer


async def test_a_retried_sync_is_answered_again_and_applied_once(redis_url: str) -> None:
    """Cap 1: the sync that offers ``a`` and ``b`` grants ``a``; sent again under its number
    it gives the same answer, and the store still holds one running and one waiting."""
    async with connected_stores(redis_url, "r") as (store,):
        ops = [offer("a"), offer("b", (1.0,))]
        seq = store.next_seq()
        (first,) = await store.sync([(model_limits(1), ops)], seq=seq)
        (again,) = await store.sync([(model_limits(1), ops)], seq=seq)
        assert first.granted == ("a",)
        assert again == first
        counts = await store.counts(model_limits(1))
        assert (counts.running, counts.waiting) == (1, 1)


async def test_a_sync_older_than_the_last_applied_is_refused(redis_url: str) -> None:
    """An attempt that reaches Redis after a later sync was applied changes nothing: a drop
    that would free the slot, sent under an older number, raises and frees nothing."""
    async with connected_stores(redis_url, "r") as (store,):
        old = store.next_seq()
        await store.sync([(model_limits(1), [offer("a")])])
        with pytest.raises(StoreUnavailableError, match="newer sync"):
            await store.sync([(model_limits(1), [Drop("a")])], seq=old)
        counts = await store.counts(model_limits(1))
        assert counts.running == 1


async def test_a_new_session_under_the_same_id_starts_its_numbers_afresh(redis_url: str) -> None:
    """A restarted worker keeps its replica id: after its resync, its first sync (number 1)
    is applied, not refused as older than its predecessor's last."""
    limits = model_limits(2)
    async with connected_stores(redis_url, "w-1") as (before,):
        for _ in range(5):
            await before.sync([(limits, [])])
    async with connected_stores(redis_url, "w-1") as (after,):
        await after.resync(limits, [])
        (result,) = await after.sync([(limits, [offer("x")])])
        assert result.granted == ("x",)


async def test_a_retried_take_charges_the_tenant_once(redis_url: str) -> None:
    """A bucket of 2 requests: one take sent three times under one request id charges one, so
    a second request still gets the last token; a third request waits."""
    rates = TenantRates("fenced", 0.01, 2.0, None, 1.0)
    async with connected_stores(redis_url, "r") as (store,):
        for _ in range(3):
            assert await store.take(rates, 10, request="t1") == 0.0
        assert await store.take(rates, 10, request="t2") == 0.0
        assert await store.take(rates, 10, request="t3") > 0.0


async def test_a_store_that_restarted_empty_is_noticed_at_the_next_call(redis_url: str) -> None:
    """A session that resynced, then a store emptied (a restart without persistence): its
    next sync and heartbeat raise ``StoreSessionLostError`` (the link then rejoins and
    writes its leases back) instead of carrying on as if its leases were there."""
    limits = model_limits(1)
    async with connected_stores(redis_url, "r") as (store,):
        await store.resync(limits, [Lease("run", "main", "t", 1.0, 10)])
        (held,) = await store.sync([(limits, [offer("wait")])])
        assert held.granted == ()  # the lease written back holds the one slot
        admin = aioredis.Redis.from_url(redis_url)
        await admin.flushall()
        await admin.aclose()
        with pytest.raises(StoreSessionLostError):
            await store.sync([(limits, [offer("late")])])
        with pytest.raises(StoreSessionLostError):
            await store.heartbeat([limits.model])
        await store.resync(limits, [Lease("run", "main", "t", 1.0, 10)])
        (after,) = await store.sync([(limits, [offer("wait")])])
        assert after.granted == ()
        assert after.counts.running == 1


async def test_a_replica_reaped_as_dead_is_told_so(redis_url: str) -> None:
    """Replica a (lease TTL 0.5 s) goes quiet for more than two TTLs and b's heartbeat
    reaps it: a's next sync raises ``StoreSessionLostError`` rather than running with the
    lease the store deleted."""
    limits = model_limits(1)
    async with connected_stores(redis_url, "a", "b", lease_ttl_s=0.5) as (a, b):
        await a.resync(limits, [Lease("run", "main", "t", 1.0, 10)])
        await b.resync(limits, [])
        await asyncio.sleep(1.2)
        await b.heartbeat([limits.model])
        with pytest.raises(StoreSessionLostError):
            await a.sync([(limits, [])])
