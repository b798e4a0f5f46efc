"""Virtual token counters across replicas: weighted fair share and the lift of idle tenants."""

from __future__ import annotations

import random

import redis.asyncio as aioredis

from sluicegate.store.keys import grants_key
from sluicegate.store.redis_store import RedisStore
from sluicegate.store.types import Drop, LaneLimits
from tests.store.store_helpers import MODEL, connected_stores, model_limits, offer

FAIR = model_limits(1, LaneLimits("main", 1, fair=True))


async def _serve_one(
    url: str, holder: RedisStore, ticket: str, stores: dict[str, RedisStore]
) -> tuple[str, str]:
    """``holder`` finishes ``ticket`` (cap 1): the one ticket granted next, with its replica."""
    (result,) = await holder.sync([(FAIR, [Drop(ticket)])])
    grants = [(holder.replica, granted) for granted in result.granted]
    async with aioredis.Redis.from_url(url) as client:
        for name, store in stores.items():
            # Only a replica with a pushed grant is asked (an empty list would block).
            if await client.llen(grants_key("sluicegate", MODEL, name)):
                grants += [(name, granted) for _, granted in await store.next_grants([MODEL], 0.5)]
    assert len(grants) == 1
    return grants[0]


async def test_weighted_shares_stay_within_one_charge(redis_url: str) -> None:
    """Tenants x (weight 1, via A) and y (weight 2, via B), both backlogged throughout.

    Both start at counter 0 and only the least-served is granted, each grant adding
    at most C / w to its tenant's counter (C the largest charge). So after every
    grant |served_x / 1 − served_y / 2| ≤ C / min(w) = C, and y gets about twice x.
    """
    rng = random.Random(15)
    charges = {f"x{i}": float(rng.randint(10, 100)) for i in range(40)}
    charges |= {f"y{i}": float(rng.randint(10, 100)) for i in range(40)}
    bound = max(charges.values())
    async with connected_stores(redis_url, "a", "b", "h") as (a, b, h):
        await h.sync([(FAIR, [offer("hold", tenant="h")])])
        x_offers = [
            offer(f"x{i}", (float(i),), tenant="x", weight=1.0, charge=charges[f"x{i}"])
            for i in range(40)
        ]
        y_offers = [
            offer(f"y{i}", (float(i),), tenant="y", weight=2.0, charge=charges[f"y{i}"])
            for i in range(40)
        ]
        await a.sync([(FAIR, x_offers)])
        await b.sync([(FAIR, y_offers)])
        stores = {"a": a, "b": b, "h": h}
        served = {"x": 0.0, "y": 0.0}
        order: dict[str, list[int]] = {"x": [], "y": []}
        holder, ticket = h, "hold"
        for grants in range(1, 51):
            replica, ticket = await _serve_one(redis_url, holder, ticket, stores)
            holder = stores[replica]
            assert replica == {"x": "a", "y": "b"}[ticket[0]]
            served[ticket[0]] += charges[ticket]
            order[ticket[0]].append(int(ticket[1:]))
            assert abs(served["x"] / 1.0 - served["y"] / 2.0) <= bound, (grants, served)
        assert 1.5 < served["y"] / served["x"] < 2.5
        # Within a tenant, its own order holds.
        assert order["x"] == list(range(len(order["x"])))
        assert order["y"] == list(range(len(order["y"])))


async def test_a_tenant_back_from_idle_gets_no_credit(redis_url: str) -> None:
    """x is served alone for a while; y arriving later is lifted to x's counter, so they alternate.

    Without the lift y's counter (0) would be far below x's and y would take
    every slot until it caught up: here the next four grants include both.
    """
    async with connected_stores(redis_url, "a", "b") as (a, b):
        await a.sync(
            [(FAIR, [offer(f"x{i}", (float(i),), tenant="x", charge=50.0) for i in range(12)])]
        )
        holder_ticket = "x0"
        for i in range(1, 6):
            (result,) = await a.sync([(FAIR, [Drop(holder_ticket)])])
            assert result.granted == (f"x{i}",)
            holder_ticket = f"x{i}"
        await b.sync(
            [(FAIR, [offer(f"y{i}", (float(i),), tenant="y", charge=50.0) for i in range(6)])]
        )
        stores = {"a": a, "b": b}
        holder, ticket = a, holder_ticket
        tenants = []
        for _ in range(4):
            replica, ticket = await _serve_one(redis_url, holder, ticket, stores)
            holder = stores[replica]
            tenants.append(ticket[0])
        assert set(tenants) == {"x", "y"}
        assert tenants.count("y") <= 3


async def test_a_correction_moves_the_counter(redis_url: str) -> None:
    """A drop's ``vtc_correction`` (served − charged) is added to the counter, over the weight."""
    async with connected_stores(redis_url, "a") as (a,):
        ops = [offer("x0", tenant="x", charge=10.0), offer("x1", (1.0,), tenant="x", charge=10.0)]
        ops += [offer("y0", (2.0,), tenant="y", charge=10.0)]
        (first,) = await a.sync([(FAIR, ops)])
        assert first.granted == ("x0",)
        # x really used 10 + 1000: it is now far behind y, which goes next despite x's order.
        (second,) = await a.sync([(FAIR, [Drop("x0", vtc_correction=1000.0)])])
        assert second.granted == ("y0",)
        (third,) = await a.sync([(FAIR, [Drop("y0")])])
        assert third.granted == ("x1",)


async def test_a_tenant_arriving_at_an_idle_lane_starts_at_the_frontier(redis_url: str) -> None:
    """x is served 5 × 50 and leaves; y, arriving alone, starts at the frontier (200), not 0.

    Then x returns (250): y is served once (200 → 250), then the tie goes to x by
    name. Starting from 0, y would take five slots in a row.
    """
    limits = model_limits(1, LaneLimits("hold", 1), LaneLimits("main", 1, fair=True))
    async with connected_stores(redis_url, "a") as (a,):
        previous: list[Drop] = []
        for i in range(5):
            (result,) = await a.sync(
                [(limits, [*previous, offer(f"x{i}", lane="main", tenant="x", charge=50.0)])]
            )
            assert result.granted == (f"x{i}",)
            previous = [Drop(f"x{i}")]
        (held,) = await a.sync([(limits, [*previous, offer("h", lane="hold", tenant="h")])])
        assert held.granted == ("h",)
        ys = [offer(f"y{i}", (float(i),), lane="main", tenant="y", charge=50.0) for i in range(5)]
        xs = [
            offer(f"x{i}", (float(i),), lane="main", tenant="x", charge=50.0) for i in range(5, 8)
        ]
        await a.sync([(limits, ys)])
        await a.sync([(limits, xs)])
        served = []
        ticket = "h"
        for _ in range(4):
            (result,) = await a.sync([(limits, [Drop(ticket)])])
            (ticket,) = result.granted
            served.append(ticket)
        assert served == ["y0", "x5", "y1", "x6"]
