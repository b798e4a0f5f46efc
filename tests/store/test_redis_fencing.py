"""Retries applied once: a sync sent again under its number is answered again and applied
never twice, an older one is refused (stale), a new session starts its numbers afresh, and
a take sent again with its request id charges the tenant once."""

from __future__ import annotations

import pytest

from sluicegate.store.store_errors import StoreUnavailableError
from sluicegate.store.types import Drop, TenantRates
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
