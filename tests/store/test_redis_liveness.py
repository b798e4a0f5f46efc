"""Leases live only as long as their replica: expiry, reaping and resync after an outage."""

from __future__ import annotations

import asyncio

import redis.asyncio as aioredis

from sluicegate.store.keys import model_base
from sluicegate.store.types import Drop, Lease
from tests.store.store_helpers import MODEL, connected_stores, model_limits, offer

TTL_S = 0.3


async def _replica_keys(url: str, replica: str) -> list[str]:
    async with aioredis.Redis.from_url(url, decode_responses=True) as client:
        base = model_base("sluicegate", MODEL)
        names = [f"{base}{kind}:{replica}" for kind in ("held", "lease", "wait", "grants")]
        return [name for name in names if await client.exists(name)]


async def test_a_silent_replicas_slots_stop_counting_and_are_reaped(redis_url: str) -> None:
    """A stops syncing: after its expiry B's offer runs; one TTL later a heartbeat reaps A."""
    async with connected_stores(redis_url, "a", "b", lease_ttl_s=TTL_S) as (a, b):
        (held,) = await a.sync([(model_limits(1), [offer("a-run")])])
        assert held.granted == ("a-run",)
        await a.sync([(model_limits(1), [offer("a-wait", (-1.0,))])])
        (early,) = await b.sync([(model_limits(1), [offer("b-wait", (5.0,))])])
        assert (early.granted, early.counts.replicas) == ((), 2)
        await asyncio.sleep(TTL_S + 0.05)
        (late,) = await b.sync([(model_limits(1), [])])
        # A's better-ordered waiter was skipped: its replica is not live.
        assert late.granted == ("b-wait",)
        assert (late.counts.running, late.counts.waiting, late.counts.replicas) == (1, 0, 1)
        assert await b.heartbeat([MODEL]) == 1
        base = model_base("sluicegate", MODEL)
        # Expired but not yet dead for a whole TTL: A's lease is kept, its waiter is gone.
        assert await _replica_keys(redis_url, "a") == [f"{base}held:a", f"{base}lease:a"]
        await asyncio.sleep(TTL_S + 0.05)
        assert await b.heartbeat([MODEL]) == 1
        assert await _replica_keys(redis_url, "a") == []
        counts = await b.counts(model_limits(1))
        assert (counts.running, counts.waiting, counts.replicas) == (1, 0, 1)


async def test_heartbeat_keeps_a_replica_live(redis_url: str) -> None:
    """Heartbeats alone (no syncs) keep A's lease counting past several TTLs."""
    async with connected_stores(redis_url, "a", "b", lease_ttl_s=TTL_S) as (a, b):
        await a.sync([(model_limits(1), [offer("a-run")])])
        for _ in range(4):
            await asyncio.sleep(TTL_S / 3)
            assert await a.heartbeat([MODEL, "other"]) == 1
        (result,) = await b.sync([(model_limits(1), [offer("b-wait")])])
        assert (result.granted, result.counts.running, result.counts.replicas) == ((), 1, 2)


async def test_resync_replaces_leases_waiters_and_grants(redis_url: str) -> None:
    """resync leaves exactly the given leases: old leases, waiters and grant list are gone."""
    async with connected_stores(redis_url, "a", "b") as (a, b):
        await a.sync([(model_limits(1), [offer("old")])])
        await b.sync([(model_limits(1), [offer("waiting")])])
        await a.sync([(model_limits(1), [Drop("old")])])  # grants "waiting" to b's list
        await b.sync([(model_limits(1), [offer("second", (9.0,))])])
        leases = [Lease("n1", "main", "t", 1.0, 7), Lease("n2", "main", "u", 2.0, 5)]
        await b.resync(model_limits(1), leases)
        assert await b.next_grants([MODEL], block_s=0.05) == []
        counts = await b.counts(model_limits(1))
        assert (counts.running, counts.inflight_tokens, counts.waiting) == (2, 12, 0)
        assert counts.lanes_running == {"main": 2}
        (after,) = await b.sync([(model_limits(1), [Drop("n1"), Drop("n2"), Drop("waiting")])])
        assert (after.counts.running, after.counts.inflight_tokens) == (0, 0)


async def test_resync_after_a_flush_restores_the_count(redis_url: str) -> None:
    """A store that lost everything (FLUSHALL) counts A's running tickets again after resync."""
    async with connected_stores(redis_url, "a", "b") as (a, b):
        await a.sync([(model_limits(1), [offer("run")])])
        async with aioredis.Redis.from_url(redis_url) as client:
            await client.flushall()
        (lost,) = await b.sync([(model_limits(1), [offer("b1")])])
        assert lost.granted == ("b1",)  # the store forgot A's lease
        await b.sync([(model_limits(1), [Drop("b1")])])
        await a.resync(model_limits(1), [Lease("run", "main", "t", 1.0, 10)])
        (held,) = await b.sync([(model_limits(1), [offer("b2")])])
        assert (held.granted, held.counts.running, held.counts.replicas) == ((), 1, 2)


async def test_reaping_withdraws_a_dead_replicas_waiters(redis_url: str) -> None:
    """A waiter of a dead replica that no fill reached leaves its sorted set when A is reaped."""
    limits = model_limits(1)
    async with connected_stores(redis_url, "a", "b", lease_ttl_s=TTL_S) as (a, b):
        await b.sync([(limits, [offer("b-run")])])
        await a.sync([(limits, [offer("a-wait")])])
        base = model_base("sluicegate", MODEL)
        async with aioredis.Redis.from_url(redis_url, decode_responses=True) as client:
            assert await client.zcard(f"{base}q:main") == 1
            assert await b.heartbeat([MODEL]) == 2
            await asyncio.sleep(2 * TTL_S + 0.05)
            assert await b.heartbeat([MODEL]) == 1
            assert await client.zcard(f"{base}q:main") == 0
            assert await _replica_keys(redis_url, "a") == []
        counts = await b.counts(limits)
        assert (counts.running, counts.waiting, counts.lanes_waiting) == (1, 0, {"main": 0})


async def test_live_replicas_lists_the_ids_live_in_any_model(redis_url: str) -> None:
    """The union over models of the replicas whose expiry is ahead; an expired one drops out."""
    async with (
        connected_stores(redis_url, "a.1", lease_ttl_s=TTL_S) as (a,),
        connected_stores(redis_url, "b.1", "c.2") as (b, c),
    ):
        await a.heartbeat([MODEL])
        await b.heartbeat(["other"])
        await c.sync([(model_limits(1), [])])
        assert await c.live_replicas([MODEL, "other"]) == {"a.1", "b.1", "c.2"}
        assert await c.live_replicas(["other"]) == {"b.1"}
        assert await c.live_replicas([]) == set()
        await asyncio.sleep(TTL_S + 0.05)
        assert await c.live_replicas([MODEL, "other"]) == {"b.1", "c.2"}


async def test_one_fill_drops_at_most_128_waiters_of_dead_replicas(redis_url: str) -> None:
    """A replica died with 300 better-ordered waiters: each fill drops at most 128 of them
    (one sync stays short), so B's waiter is granted by the third sync, not the first."""
    async with connected_stores(redis_url, "a", "b", lease_ttl_s=TTL_S) as (a, b):
        dead = [offer(f"a{i}", (float(i),)) for i in range(300)]
        await a.sync([(model_limits(1), [offer("a-run", (-1.0,)), *dead])])
        await b.sync([(model_limits(1), [offer("b-wait", (1000.0,))])])
        await asyncio.sleep(TTL_S + 0.05)
        grants = [(await b.sync([(model_limits(1), [])]))[0].granted for _ in range(3)]
        assert grants == [(), (), ("b-wait",)]
