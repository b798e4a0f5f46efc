"""The sync script's fill on a real redis-server: order, caps, budgets, cross-replica grants."""

from __future__ import annotations

import asyncio
import time

import pytest
import redis.asyncio as aioredis

from sluicegate.store.keys import grants_key
from sluicegate.store.redis_store import RedisStore
from sluicegate.store.types import Drop, LaneLimits, ModelLimits, Offer
from tests.store.store_helpers import MODEL, connected_stores, model_limits, offer


async def _release(
    holder: RedisStore, ticket: str, stores: list[RedisStore], cap: int
) -> list[str]:
    """``holder`` drops ``ticket``; every store's grants that follow, as ``replica/ticket``."""
    (result,) = await holder.sync([(model_limits(cap), [Drop(ticket)])])
    grants = [f"{holder.replica}/{granted}" for granted in result.granted]
    for store in stores:
        if store is not holder:
            pushed = await store.next_grants([MODEL], block_s=0.05)
            grants += [f"{store.replica}/{granted}" for _, granted in pushed]
    return grants


@pytest.mark.parametrize(
    ("orders_a", "orders_b"),
    [
        # fifo-like: (arrival,)
        ([(5.0,), (3.0,), (-2.0,)], [(1.0,), (4.0,), (0.0,)]),
        # priority-like: (priority, deadline, arrival)
        (
            [(1.0, 10.0, 1.0), (0.0, 20.0, 2.0)],
            [(0.0, 15.0, 3.0), (1.0, 5.0, 4.0), (0.0, 20.0, 0.5)],
        ),
    ],
)
async def test_best_waiter_of_any_replica_is_granted_first(
    redis_url: str, orders_a: list[tuple[float, ...]], orders_b: list[tuple[float, ...]]
) -> None:
    """With cap 1, released slots go to the waiters of both replicas in ascending order."""
    async with connected_stores(redis_url, "a", "b", "c") as (a, b, c):
        (held,) = await c.sync([(model_limits(1), [offer("hold")])])
        assert held.granted == ("hold",)
        await a.sync([(model_limits(1), [offer(f"a{i}", o) for i, o in enumerate(orders_a)])])
        await b.sync([(model_limits(1), [offer(f"b{i}", o) for i, o in enumerate(orders_b)])])
        named = {f"a/a{i}": o for i, o in enumerate(orders_a)} | {
            f"b/b{i}": o for i, o in enumerate(orders_b)
        }
        expected = sorted(named, key=lambda name: named[name])
        served: list[str] = []
        holder, ticket = c, "hold"
        for _ in expected:
            grants = await _release(holder, ticket, [a, b, c], cap=1)
            assert len(grants) == 1
            served += grants
            replica, ticket = grants[0].split("/")
            holder = a if replica == "a" else b
        assert served == expected
        (last,) = await holder.sync([(model_limits(1), [Drop(ticket)])])
        assert last.counts.running == last.counts.waiting == 0


async def test_model_cap_bounds_grants(redis_url: str) -> None:
    """Five offers, model cap 2: two granted in the sync's answer, three wait."""
    async with connected_stores(redis_url, "a") as (a,):
        (result,) = await a.sync(
            [(model_limits(2), [offer(f"t{i}", (float(i),)) for i in range(5)])]
        )
        assert result.granted == ("t0", "t1")
        assert (result.counts.running, result.counts.waiting, result.counts.replicas) == (2, 3, 1)
        assert result.counts.inflight_tokens == 20


async def test_lane_caps_and_lane_order(redis_url: str) -> None:
    """Non-borrowing lanes stop at their cap; lanes are served in the order given."""
    limits = model_limits(3, LaneLimits("hi", 1), LaneLimits("lo", 1))
    ops = [offer("lo0", lane="lo"), offer("lo1", lane="lo"), offer("hi0", lane="hi")]
    ops += [offer("hi1", (1.0,), lane="hi")]
    async with connected_stores(redis_url, "a") as (a,):
        (result,) = await a.sync([(limits, ops)])
        assert result.granted == ("hi0", "lo0")
        counts = await a.counts(limits)
        assert counts.lanes_running == {"hi": 1, "lo": 1}
        assert counts.lanes_waiting == {"hi": 1, "lo": 1}
        # Model cap 1: the first lane in order wins, though "lo" offered first.
        narrow = model_limits(1, LaneLimits("hi", 1), LaneLimits("lo", 1))
        (after,) = await a.sync([(narrow, [Drop("hi0"), Drop("lo0")])])
        assert after.granted == ("hi1",)


async def test_borrowing_lane_takes_only_the_idle_quota_of_lending_lanes(redis_url: str) -> None:
    """Model cap 4, a borrowing lane of cap 1 and an idle lane of cap 2: the borrower takes
    its own slot and the lender's two idle ones (ModelRuntime.lendable), not the model's
    fourth; a lender's waiter then gets its quota back as the borrowers leave."""
    limits = model_limits(4, LaneLimits("burst", 1, borrow=True), LaneLimits("idle", 2, lend=True))
    async with connected_stores(redis_url, "a") as (a,):
        ops = [offer(f"t{i}", (float(i),), lane="burst") for i in range(5)]
        (result,) = await a.sync([(limits, ops)])
        assert result.granted == ("t0", "t1", "t2")
        assert result.counts.waiting == 2
        counts = await a.counts(limits)
        assert counts.lanes_running == {"burst": 3, "idle": 0}
        # The lender's own ticket takes a free model slot: one of its two quota slots is
        # lent, one is its own now, so nothing is left to borrow.
        (after,) = await a.sync([(limits, [offer("own", lane="idle")])])
        assert after.granted == ("own",)
        (freed,) = await a.sync([(limits, [Drop("t1")])])
        assert freed.granted == ()


async def test_a_lane_that_does_not_lend_lends_nothing(redis_url: str) -> None:
    """Model cap 3, a borrowing lane of cap 1 beside an idle lane that does not lend: the
    borrower runs one ticket only, though the model has two slots free."""
    limits = model_limits(3, LaneLimits("burst", 1, borrow=True), LaneLimits("idle", 2))
    async with connected_stores(redis_url, "a") as (a,):
        ops = [offer(f"t{i}", (float(i),), lane="burst") for i in range(3)]
        (result,) = await a.sync([(limits, ops)])
        assert result.granted == ("t0",)


async def test_token_budget_is_head_of_line(redis_url: str) -> None:
    """Budget 100: 60 runs, 50 would overflow and blocks the 30 behind it."""
    limits = model_limits(10, token_budget=100)
    costs = [60, 50, 30]
    ops = [offer(f"t{i}", (float(i),), cost=cost) for i, cost in enumerate(costs)]
    async with connected_stores(redis_url, "a") as (a,):
        (result,) = await a.sync([(limits, ops)])
        assert result.granted == ("t0",)
        assert result.counts.inflight_tokens == 60
        (after,) = await a.sync([(limits, [Drop("t0")])])
        assert after.granted == ("t1", "t2")
        assert after.counts.inflight_tokens == 80


async def test_token_budget_admits_anything_into_an_idle_model(redis_url: str) -> None:
    """With nothing running, a ticket over the whole budget still runs (n == 0)."""
    async with connected_stores(redis_url, "a") as (a,):
        (result,) = await a.sync([(model_limits(10, token_budget=100), [offer("big", cost=500)])])
        assert result.granted == ("big",)
        (second,) = await a.sync([(model_limits(10, token_budget=100), [offer("small", cost=1)])])
        assert second.granted == ()


async def test_release_grants_another_replicas_waiter_within_one_call(redis_url: str) -> None:
    """A's release grants B's waiter: not in A's answer, in B's very next ``next_grants``."""
    async with connected_stores(redis_url, "a", "b") as (a, b):
        await a.sync([(model_limits(1), [offer("x")])])
        (waiting,) = await b.sync([(model_limits(1), [offer("y")])])
        assert waiting.granted == ()
        started = time.monotonic()
        assert await b.next_grants([MODEL], block_s=0.2) == []
        assert time.monotonic() - started >= 0.19
        listener = asyncio.create_task(b.next_grants([MODEL, "other"], block_s=2.0))
        await asyncio.sleep(0.05)
        (released,) = await a.sync([(model_limits(1), [Drop("x")])])
        assert released.granted == ()
        assert released.counts.running == 1
        assert await asyncio.wait_for(listener, 1.0) == [(MODEL, "y")]


async def test_next_grants_drains_every_model(redis_url: str) -> None:
    """Grants piled up in two models come back from one call, in order per model."""
    other = model_limits(5, model="other")
    async with connected_stores(redis_url, "a", "b") as (a, b):
        await a.sync([(model_limits(1), [offer("x")]), (other, [offer(f"o{i}") for i in range(5)])])
        await b.sync(
            [
                (model_limits(1), [offer("y")]),
                (other, [offer(f"p{i}", (float(i),)) for i in range(3)]),
            ]
        )
        await a.sync(
            [(model_limits(1), [Drop("x")]), (other, [Drop("o0"), Drop("o1"), Drop("o2")])]
        )
        grants = await b.next_grants([MODEL, "other"], block_s=1.0)
        assert sorted(grants) == [(MODEL, "y"), ("other", "p0"), ("other", "p1"), ("other", "p2")]
        assert [t for m, t in grants if m == "other"] == ["p0", "p1", "p2"]


async def test_offers_are_idempotent_and_drops_withdraw(redis_url: str) -> None:
    """Offering a waiting ticket again changes nothing; offering a running one again changes
    nothing but answers its grant again (its first grant was lost on the way); a drop
    withdraws a waiter."""
    async with connected_stores(redis_url, "a") as (a,):
        (first,) = await a.sync([(model_limits(1), [offer("run"), offer("wait", (1.0,))])])
        assert first.granted == ("run",)
        (again,) = await a.sync([(model_limits(1), [offer("run"), offer("wait", (1.0,))])])
        assert (again.granted, again.counts.running, again.counts.waiting) == (("run",), 1, 1)
        (dropped,) = await a.sync([(model_limits(1), [Drop("wait"), Drop("unknown")])])
        assert (dropped.counts.running, dropped.counts.waiting) == (1, 0)
        (freed,) = await a.sync([(model_limits(1), [Drop("run")])])
        assert (freed.granted, freed.counts.running, freed.counts.inflight_tokens) == ((), 0, 0)


@pytest.mark.parametrize(
    ("limits", "cost"),
    [(model_limits(1), 10), (model_limits(64, token_budget=100), 60)],
    ids=["last-slot", "budget-for-one"],
)
async def test_sixty_four_racing_replicas_admit_exactly_one(
    redis_url: str, limits: ModelLimits, cost: int
) -> None:
    """64 stores sync one offer each at once, room for one: one grant in total, anywhere."""
    replicas = [f"r{i}" for i in range(64)]
    # A generous timeout: this is about atomicity, and 64 clients load 2 shared cores.
    async with (
        connected_stores(redis_url, *replicas, timeout_s=5.0) as stores,
        aioredis.Redis.from_url(redis_url) as client,
    ):
        results = await asyncio.gather(
            *(store.sync([(limits, [offer(f"t{i}", cost=cost)])]) for i, store in enumerate(stores))
        )
        granted = [t for (result,) in results for t in result.granted]
        pushed = [await client.llen(grants_key("sluicegate", MODEL, name)) for name in replicas]
        assert len(granted) == 1
        assert pushed == [0] * 64
        counts = await stores[0].counts(limits)
        assert (counts.running, counts.waiting, counts.replicas) == (1, 63, 64)
        assert counts.inflight_tokens == cost


async def test_unknown_lane_is_refused_before_sending(redis_url: str) -> None:
    """An offer in a lane the limits do not list is a ``ValueError``, and nothing is stored."""
    async with connected_stores(redis_url, "a") as (a,):
        with pytest.raises(ValueError, match="lane 'nowhere'"):
            await a.sync([(model_limits(1), [Offer("t", "nowhere", "x", 1.0, (0.0,), 1, 1.0)])])
        counts = await a.counts(model_limits(1))
        assert (counts.running, counts.waiting, counts.replicas) == (0, 0, 0)
