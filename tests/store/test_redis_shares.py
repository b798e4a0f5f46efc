"""Tenant shares across replicas: a ``vtc`` lane whose blocked head's tenant is under its
share of the lane takes a slot back from the newest preemptible ticket of the tenant
furthest over its share (``core/preemption.py`` ``_share_preempt``), whichever replica runs
it. Every answer is checked against the Python model of the store as well."""

from __future__ import annotations

import asyncio

import pytest
import redis.asyncio as aioredis

from sluicegate.store.keys import grants_key
from sluicegate.store.types import Drop, LaneLimits, Lease, ModelLimits, Offer
from tests.store.reference_store import ReferenceStore
from tests.store.store_helpers import MODEL, connected_stores

PAST = 1.0  # wall-clock seconds long gone: the share's grace is over
FUTURE = 1e11


def fair_offer(
    ticket: str, tenant: str, *, priority: int = 2, share_from: float | None = PAST
) -> Offer:
    """A ticket of lane ``f`` (weight 1), preemptible at once once running."""
    return Offer(ticket, "f", tenant, 1.0, (0.0,), 10, 30.0, priority, None, 0.0, share_from)


def limits(shares: str) -> ModelLimits:
    """Model cap 2, one fair lane of cap 2 that gives shares back by ``shares``."""
    return ModelLimits(MODEL, 2, None, (LaneLimits("f", 2, fair=True, shares=shares),))


@pytest.mark.parametrize(
    ("shares", "runner_priority", "share_from", "stopped"),
    [
        ("always", 2, PAST, ["!x2"]),  # A holds both slots, B's share is one: the newest goes
        ("always", 2, FUTURE, []),  # B's grace (preempt_after_ms) has not passed
        ("priority", 2, PAST, []),  # tiers: only priorities 4-5 give slots back
        ("priority", 4, PAST, ["!x2"]),
        ("", 2, PAST, []),  # a lane without shares (never, or fraction-preemptible)
    ],
)
async def test_a_tenant_under_its_share_takes_a_slot_back_across_replicas(
    redis_url: str,
    shares: str,
    runner_priority: int,
    share_from: float,
    stopped: list[str],
) -> None:
    """Tenant A runs both slots of the lane through replica a; tenant B's ticket queues at
    b. Where the rules allow, the store tells a to stop A's newest ticket; its drop then
    grants B's ticket to b. The model of the store agrees at every step."""
    lim = limits(shares)
    model = ReferenceStore(lim)
    admin = aioredis.Redis.from_url(redis_url, decode_responses=True)
    try:
        async with connected_stores(redis_url, "a", "b") as (a, b):
            for store in (a, b):
                await store.resync(lim, [])
            ops: list[Offer | Drop] = [
                fair_offer("x1", "A", priority=runner_priority),
                fair_offer("x2", "A", priority=runner_priority),
            ]
            (held,) = await a.sync([(lim, ops)])
            assert list(held.granted) == model.sync("a", ops)[0] == ["x1", "x2"]
            await asyncio.sleep(0.002)  # admitted strictly before the waiter's sync
            waiter: list[Offer | Drop] = [fair_offer("y1", "B", share_from=share_from)]
            (queued,) = await b.sync([(lim, waiter)])
            assert (list(queued.granted), list(queued.stops)) == model.sync("b", waiter)
            assert queued.granted == ()
            pushed = await admin.lrange(grants_key("sluicegate", MODEL, "a"), 0, -1)
            assert pushed == model.pushed.get("a", []) == stopped
            if stopped:
                drop: list[Offer | Drop] = [Drop("x2")]
                await a.sync([(lim, drop)])
                model.sync("a", drop)
                to_b = await admin.lrange(grants_key("sluicegate", MODEL, "b"), 0, -1)
                assert to_b == model.pushed.get("b", []) == ["y1"]
    finally:
        await admin.flushall()
        await admin.aclose()


async def test_leases_written_back_count_for_the_shares(redis_url: str) -> None:
    """After a rejoin (``resync``) the written-back leases of a lane with shares count again:
    tenant B's waiter has A's newest ticket stopped, as before the store restarted."""
    lim = limits("always")
    admin = aioredis.Redis.from_url(redis_url, decode_responses=True)
    try:
        async with connected_stores(redis_url, "a", "b") as (a, b):
            leases = [Lease(t, "f", "A", 1.0, 10, 2, 0.0, counted=True) for t in ("x1", "x2")]
            await a.resync(lim, leases)
            await b.resync(lim, [])
            await asyncio.sleep(0.002)
            (queued,) = await b.sync([(lim, [fair_offer("y1", "B")])])
            assert queued.granted == ()
            assert await admin.lrange(grants_key("sluicegate", MODEL, "a"), 0, -1) == ["!x2"]
    finally:
        await admin.flushall()
        await admin.aclose()


async def test_a_lane_without_shares_keeps_no_counts_per_tenant(redis_url: str) -> None:
    """The running counts per tenant are kept only where shares are given back: a fair lane
    without them leaves no ``tr:``/``tw:`` keys behind its grants."""
    lim = limits("")
    admin = aioredis.Redis.from_url(redis_url, decode_responses=True)
    try:
        async with connected_stores(redis_url, "a") as (a,):
            await a.resync(lim, [])
            (held,) = await a.sync([(lim, [fair_offer("x1", "A")])])
            assert held.granted == ("x1",)
            assert await admin.keys("*tr:*") == []
            assert await admin.keys("*tw:*") == []
    finally:
        await admin.flushall()
        await admin.aclose()
