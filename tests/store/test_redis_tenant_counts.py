"""``RedisStore.counts``' running tickets per tenant: summed over the live replicas' leases,
per lane, a dead replica's left out, and a lease tuple with fields added after its first
four read the same."""

from __future__ import annotations

import asyncio

import redis.asyncio as aioredis

from sluicegate.store.keys import model_base
from sluicegate.store.types import Drop, LaneLimits, Lease
from tests.store.store_helpers import MODEL, connected_stores, model_limits, offer

TTL_S = 0.3
LANES = (LaneLimits("hi", 8), LaneLimits("lo", 8, fair=True))


async def test_running_tickets_per_tenant_are_summed_over_replicas_and_lanes(
    redis_url: str,
) -> None:
    """Tenants running on two replicas in two lanes: each replica reads the same counts per
    (tenant, lane), equal to what each replica was granted; a waiting ticket is not counted;
    a drop takes its ticket out."""
    limits = model_limits(5, *LANES)
    async with connected_stores(redis_url, "a", "b") as (a, b):
        ops_a = [offer("a1", tenant="x", lane="hi"), offer("a2", tenant="x", lane="lo")]
        ops_a.append(offer("a3", tenant="y", lane="hi"))
        ops_b = [offer("b1", tenant="x", lane="hi"), offer("b2", tenant="z", lane="lo")]
        ops_b.append(offer("b3", tenant="z", lane="lo"))  # the sixth: waits (cap 5)
        (granted_a,) = await a.sync([(limits, ops_a)])
        (granted_b,) = await b.sync([(limits, ops_b)])
        assert (len(granted_a.granted), granted_b.granted) == (3, ("b1", "b2"))
        expected = {("x", "hi"): 2, ("x", "lo"): 1, ("y", "hi"): 1, ("z", "lo"): 1}
        for store in (a, b):
            counts = await store.counts(limits)
            assert counts.tenants_running == expected
            assert (counts.running, counts.waiting) == (5, 1)
            assert sum(counts.tenants_running.values()) == counts.running
        await a.sync([(limits, [Drop("a1")])])  # frees a slot: b3 is granted
        counts = await a.counts(limits)
        assert counts.tenants_running == {
            ("x", "hi"): 1, ("x", "lo"): 1, ("y", "hi"): 1, ("z", "lo"): 2,
        }  # fmt: skip


async def test_a_dead_replicas_leases_stop_counting(redis_url: str) -> None:
    """When A stops syncing, its tenants' running tickets leave B's read one TTL later."""
    limits = model_limits(4)
    async with connected_stores(redis_url, "a", "b", lease_ttl_s=TTL_S) as (a, b):
        await a.sync([(limits, [offer("a1", tenant="x")])])
        await b.sync([(limits, [offer("b1", tenant="y")])])
        assert (await b.counts(limits)).tenants_running == {("x", "main"): 1, ("y", "main"): 1}
        for _ in range(3):
            await asyncio.sleep(TTL_S / 2)
            await b.heartbeat([MODEL])
        counts = await b.counts(limits)
        assert counts.tenants_running == {("y", "main"): 1}
        assert counts.replicas == 1


async def test_fields_added_after_a_leases_first_four_are_ignored(redis_url: str) -> None:
    """A lease written with more fields than (lane, tenant, cost, weight), as a later version
    of the scripts may write it, counts under its lane and tenant like any other."""
    limits = model_limits(4)
    async with connected_stores(redis_url, "a") as (a,):
        await a.resync(limits, [Lease("r1", "main", "x", 1.0, 10)])
        base = model_base("sluicegate", MODEL)
        async with aioredis.Redis.from_url(redis_url) as client:
            script = "return redis.call('HSET', KEYS[1], 'r2', cmsgpack.pack(unpack(ARGV)))"
            await client.eval(script, 1, f"{base}lease:a", "main", "y", 10, 1.0, 7, "extra")
        counts = await a.counts(limits)
        assert counts.tenants_running == {("x", "main"): 1, ("y", "main"): 1}
