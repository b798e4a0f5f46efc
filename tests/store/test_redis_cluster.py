"""``RedisStore`` on a real Redis Cluster (three masters, one replica each): every script
stays in its declared key's slot, one sync spans masters, grants come through per slot,
and the global cap and a tenant's buckets hold with three replicas."""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import redis
from redis.crc import key_slot
from typer.testing import CliRunner

from sluicegate.cli import app
from sluicegate.store.keys import model_base, rate_key
from sluicegate.store.redis_store import RedisStore
from sluicegate.store.store_errors import StoreUnavailableError
from sluicegate.store.types import (
    Drop,
    LaneLimits,
    Lease,
    ModelLimits,
    Offer,
    Refund,
    TenantRates,
)
from tests.store.redis_cluster import RedisCluster
from tests.store.redis_server import free_port
from tests.store.store_helpers import model_limits, offer

PREFIX = "sluicegate"


def _models(cluster: RedisCluster) -> list[str]:
    """Three model names whose keys live on the three masters."""
    return cluster.keys_on_distinct_masters(3, lambda name: model_base(PREFIX, name))


async def _stores(url: str, *replicas: str) -> list[RedisStore]:
    stores = [RedisStore(url, replica=r, timeout_s=1.0, cluster=True) for r in replicas]
    for store in stores:
        await store.connect()
    return stores


@pytest.fixture
async def stores(cluster_url: str) -> AsyncIterator[list[RedisStore]]:
    """Three connected cluster stores: replicas ``a``, ``b`` and ``c``."""
    opened = await _stores(cluster_url, "a", "b", "c")
    try:
        yield opened
    finally:
        for store in opened:
            await store.close()


async def _grants(store: RedisStore, models: list[str], count: int) -> list[tuple[str, str]]:
    """``count`` grants from ``store``'s listener (one pop per slot: several calls)."""
    grants: list[tuple[str, str]] = []
    async with asyncio.timeout(5.0):
        while len(grants) < count:
            grants += await store.next_grants(models, block_s=1.0)
    return grants


async def test_every_script_stays_in_its_declared_slot(
    redis_cluster: RedisCluster, stores: list[RedisStore]
) -> None:
    """Every store call runs on a cluster whose masters hold three models and a tenant:
    Redis ≥ 7 refuses a script with a flags line (all of the store's) that touches a key of
    another slot than its declared key's, as the last check shows, so none of them does;
    and every key written is in a model's or the tenant's slot, on that slot's master."""
    a, b, _ = stores
    models = _models(redis_cluster)
    fair = LaneLimits("fair", 2, fair=True)
    limits = [ModelLimits(m, 2, 100, (LaneLimits("main", 2), fair)) for m in models]
    rates = TenantRates("t", 100.0, 10.0, 1000.0, 100.0)
    await a.sync([(lim, [offer(f"{lim.model}-1"), offer("f", lane="fair")]) for lim in limits])
    await b.sync([(lim, [offer(f"{lim.model}-2", (1.0,))]) for lim in limits])
    await a.sync([(lim, [Drop(f"{lim.model}-1"), Refund(rates, 5)]) for lim in limits])
    assert sorted(await _grants(b, models, 3)) == sorted((m, f"{m}-2") for m in models)
    assert await a.take(rates, 10) == 0.0
    assert await a.heartbeat(models) == 2
    assert await a.live_replicas(models) == {"a", "b"}
    await b.resync(limits[0], [Lease("kept", "main", "t", 1.0, 3)])
    counts = await a.counts(limits[0])
    assert (counts.running, counts.lanes_running) == (2, {"main": 1, "fair": 1})
    slots = {key_slot(model_base(PREFIX, m).encode()) for m in models}
    slots.add(key_slot(rate_key(PREFIX, "t").encode()))
    holders = set()
    for port in redis_cluster.masters():
        with redis.Redis(port=port) as node:
            for key in node.scan_iter(count=1000):
                assert key_slot(key) in slots, key
                assert redis_cluster.owner(key.decode()) == port
                holders.add(port)
    assert holders == set(redis_cluster.masters())
    owner = redis_cluster.owner(model_base(PREFIX, models[0]))
    other = next(k for k in ("x", "y", "z", "w") if redis_cluster.owner(k) == owner)
    with redis.Redis(port=owner) as node, pytest.raises(redis.ResponseError, match="same slot"):
        node.eval(
            f"#!lua flags=allow-oom\nreturn redis.call('GET', '{other}')",
            1,
            model_base(PREFIX, models[0]),
        )


async def test_one_sync_spans_masters_and_answers_in_order(
    redis_cluster: RedisCluster, stores: list[RedisStore]
) -> None:
    """One sync of three models (three masters): each answer is its own model's, in the
    order of the batches; a release on each grants B's waiter, pushed to B's grant list in
    the model's slot, and B's listener returns all three, in push order per model."""
    a, b, _ = stores
    models = _models(redis_cluster)
    caps = {m: 1 + i for i, m in enumerate(models)}
    first = await a.sync(
        [(model_limits(caps[m], model=m), [offer(f"{m}-{n}") for n in range(3)]) for m in models]
    )
    assert [r.granted for r in first] == [tuple(f"{m}-{n}" for n in range(caps[m])) for m in models]
    assert [r.counts.waiting for r in first] == [3 - caps[m] for m in models]
    waiting = [
        (model_limits(caps[m], model=m), [offer(f"b-{m}-{n}") for n in range(2)]) for m in models
    ]
    await b.sync(waiting)
    release = [
        (model_limits(caps[m], model=m), [Drop(f"{m}-{n}") for n in range(3)]) for m in models
    ]
    answers = await a.sync(release)
    assert [r.counts.running for r in answers] == [min(2, caps[m]) for m in models]
    grants = await _grants(b, models, sum(min(2, caps[m]) for m in models))
    for m in models:
        assert [t for model, t in grants if model == m] == [
            f"b-{m}-{n}" for n in range(min(2, caps[m]))
        ]


async def test_the_global_cap_holds_with_three_replicas(
    redis_cluster: RedisCluster, stores: list[RedisStore]
) -> None:
    """Three replicas offer and release tickets of three models at random, each admitting
    what its syncs and its listener grant: no ticket is granted twice, the store never
    counts more than the cap running, and the replicas never hold more than it between
    them; in the end every ticket was granted once."""
    models = _models(redis_cluster)
    cap = 3
    limits = {m: model_limits(cap, model=m) for m in models}
    holding: dict[str, set[str]] = {m: set() for m in models}
    granted: list[str] = []
    peak = dict.fromkeys(models, 0)

    def admit(model: str, ticket: str) -> None:
        granted.append(ticket)
        holding[model].add(ticket)
        peak[model] = max(peak[model], len(holding[model]))
        assert len(holding[model]) <= cap, (model, holding[model])

    async def replica(store: RedisStore, seed: int) -> None:
        rng = random.Random(seed)
        mine: dict[str, list[str]] = {m: [] for m in models}
        for round_ in range(25):
            batches = []
            for m in models:
                fresh = [offer(f"{store.replica}-{m}-{round_}-{k}") for k in range(2)]
                ops: list[Offer | Drop] = list(fresh)
                running = [t for t in mine[m] if t in holding[m]]
                for ticket in rng.sample(running, k=min(len(running), rng.randint(0, 2))):
                    holding[m].discard(ticket)
                    mine[m].remove(ticket)
                    ops.append(Drop(ticket))
                mine[m] += [op.ticket for op in fresh]
                batches.append((limits[m], ops))
            for (lim, _), answer in zip(batches, await store.sync(batches), strict=True):
                assert answer.counts.running <= cap
                for ticket in answer.granted:
                    admit(lim.model, ticket)
            for model, ticket in await store.next_grants(models, block_s=0.01):
                admit(model, ticket)
            await asyncio.sleep(rng.random() * 0.005)
        # Release everything: what is still waiting is then granted and released in turn.
        while any(mine.values()):
            for model, ticket in await store.next_grants(models, block_s=0.05):
                admit(model, ticket)
            batches = []
            for m in models:
                done = [t for t in mine[m] if t in holding[m]]
                for ticket in done:
                    holding[m].discard(ticket)
                    mine[m].remove(ticket)
                batches.append((limits[m], [Drop(t) for t in done]))
            for (lim, _), answer in zip(batches, await store.sync(batches), strict=True):
                for ticket in answer.granted:
                    admit(lim.model, ticket)

    async with asyncio.timeout(40.0):
        await asyncio.gather(*(replica(store, i) for i, store in enumerate(stores)))
    assert len(granted) == len(set(granted)) == 3 * 3 * 25 * 2
    assert all(value == cap for value in peak.values()), peak
    for m in models:
        counts = await stores[0].counts(limits[m])
        assert (counts.running, counts.waiting) == (0, 0)


async def test_a_tenants_buckets_hold_across_replicas(
    redis_cluster: RedisCluster, stores: list[RedisStore]
) -> None:
    """Two tenants whose buckets live on different masters, burst 10 and a refill too slow
    to matter: thirty takes from three replicas at once admit exactly ten of each tenant,
    and every refusal names a wait."""
    tenants = redis_cluster.keys_on_distinct_masters(2, lambda name: rate_key(PREFIX, name))
    rates = [TenantRates(t, 0.001, 10.0, None, 1.0) for t in tenants]
    waits = await asyncio.gather(
        *(stores[n % 3].take(rates[n % 2], 1) for n in range(60)),
    )
    for index in range(2):
        mine = waits[index::2]
        assert sum(wait == 0.0 for wait in mine) == 10
        assert all(wait > 100.0 for wait in mine if wait != 0.0)


async def test_a_unix_socket_or_a_database_is_refused(cluster_url: str) -> None:
    """A cluster store URL names a TCP node of database 0: anything else is refused at once;
    a seed that does not answer is an unavailable store."""
    for url in ("unix:///tmp/redis.sock", cluster_url.replace("/0", "/1")):
        with pytest.raises(ValueError, match=r"distributed\.cluster"):
            await RedisStore(url, replica="a", cluster=True).connect()
    store = RedisStore(f"redis://127.0.0.1:{free_port()}/0", replica="a", cluster=True)
    with pytest.raises(StoreUnavailableError):
        await store.connect()
    await store.close()


def test_check_config_connect_pings_every_master(
    redis_cluster: RedisCluster, cluster_url: str, tmp_path: Path
) -> None:
    """``check-config --connect`` with ``cluster: true`` reaches every master: it succeeds,
    and fails while one master other than the seed is paused (SIGSTOP; shorter than the
    node timeout, so no failover), which a ping of the seed alone would not notice."""
    config = tmp_path / "sluicegate.yaml"
    text = f"models: [{{name: m}}]\nstore: {cluster_url}\n"
    config.write_text(text + "distributed: {cluster: true, timeout_ms: 200}\n")
    command = ["check-config", str(config), "--connect"]
    result = CliRunner().invoke(app, command)
    assert result.exit_code == 0, result.output
    seed = int(cluster_url.rsplit(":", 1)[1].split("/")[0])
    other = redis_cluster.server(next(p for p in redis_cluster.masters() if p != seed))
    other.pause()
    try:
        result = CliRunner().invoke(app, command)
    finally:
        other.resume()
    assert result.exit_code == 1, result.output
    assert "store: unreachable" in result.output
