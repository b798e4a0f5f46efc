"""The Redis store's own costs: round trip per call and Redis memory per waiting ticket.

One private ``redis-server`` on loopback, one ``RedisStore`` (no gateway):

1. Round trips: median and p99 over ``--calls`` calls of ``ping``, ``sync`` with 1
   op (alternately an offer that is granted and the drop of that ticket), ``sync``
   with 32 ops (16 offers granted, 16 drops of the previous call's tickets; in a
   lane without fairness and in a ``vtc`` lane with 100 tenants),
   ``take`` (a rate-limited tenant) and ``heartbeat`` (one model), and the
   Redis CPU per call (``INFO commandstats``: the ``usec`` of ``EVALSHA`` and ``PING``).
2. Memory: ``MEMORY USAGE`` (all elements) summed over the model's keys, and
   ``INFO memory`` ``used_memory``, before and after ``--waiting`` tickets wait
   behind a full model; per waiting ticket, for a lane without fairness and a
   1-float order (fifo), and for a ``vtc`` lane with 100 tenants and a 3-float
   order (priority-like). Replica ids are 32 characters, ticket ids 16.
3. The operator's read of running tickets per tenant (``counts``, O(running tickets)):
   median round trip and Redis CPU per call with 0, 1,000 and 10,000 tickets running
   (leases of 3 replicas, 50 tenants, 2 lanes), over ``--calls`` / 10 calls.
4. With ``--cluster``: the round trips again on a private Redis Cluster (six
   ``redis-server --cluster-enabled yes``, three masters; ``RedisStore(cluster=True)``),
   case by case beside the single server, plus ``sync`` of three models (one op each)
   whose keys are on three masters, and the same through redis-py's ``RedisCluster``
   pipeline for comparison. Client CPU per call is the benchmark process's CPU time
   (``time.process_time``) over the calls: what a gateway pays per round trip.

    python benchmarks/bench_store_rtt.py [--calls 1000] [--waiting 10000] [--cluster]
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import redis.asyncio as aioredis

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.store.redis_cluster import RedisCluster, running_cluster
from tests.store.redis_server import running_redis

from sluicegate.store.redis_store import RedisStore
from sluicegate.store.types import (
    Drop,
    LaneLimits,
    Lease,
    ModelLimits,
    Offer,
    TenantRates,
)

REPLICA = "gateway-7f9c8d6b5-x2k4q-1234.1"
RATES = TenantRates("bench", 1e9, 1e9, 1e12, 1e12)
_TOP_LEVEL = ("evalsha", "ping")


def _ticket(number: int) -> str:
    return f"{number:016x}"


Timed = tuple[float, float, float, float]
"""Median and p99 round trip (ms), Redis CPU per call (µs) and client CPU per call (µs)."""


async def _timed(
    clients: list[aioredis.Redis], call: Callable[[], Awaitable[object]], calls: int
) -> Timed:
    """One case over ``calls`` calls; Redis CPU summed over ``clients`` (every master)."""
    for _ in range(min(100, calls)):
        await call()
    for client in clients:
        await client.config_resetstat()
    samples = []
    cpu_started = time.process_time()
    for _ in range(calls):
        started = time.perf_counter()
        await call()
        samples.append(time.perf_counter() - started)
    cpu_us = (time.process_time() - cpu_started) * 1e6 / calls
    busy_us = 0
    for client in clients:
        stats = await client.info("commandstats")
        # Only the top-level commands: a script's own calls are counted again under their names.
        busy_us += sum(int(stats.get(f"cmdstat_{name}", {}).get("usec", 0)) for name in _TOP_LEVEL)
    samples.sort()
    median_ms = statistics.median(samples) * 1e3
    return median_ms, samples[int(0.99 * (len(samples) - 1))] * 1e3, busy_us / calls, cpu_us


Case = tuple[str, Callable[[], Awaitable[object]]]


def _cases(store: RedisStore, spread: list[str]) -> list[Case]:
    """The round-trip cases on ``store``; ``spread``: three models (on three masters of a
    cluster) for the sync of several models."""
    limits = ModelLimits("m", 64, None, (LaneLimits("main", 64),))
    counter = iter(range(10**9))
    state: dict[str, list[str]] = {"held": []}

    async def one_op() -> None:
        if state["held"]:
            await store.sync([(limits, [Drop(state["held"].pop())])])
        else:
            ticket = _ticket(next(counter))
            await store.sync([(limits, [Offer(ticket, "main", "t", 1.0, (1.0,), 10, 30.0)])])
            state["held"].append(ticket)

    def thirty_two_ops(lanes: ModelLimits, tenants: int) -> Callable[[], Awaitable[None]]:
        async def call() -> None:
            fresh = [_ticket(next(counter)) for _ in range(16)]
            ops: list[Offer | Drop] = [Drop(ticket) for ticket in state["held"]]
            ops += [Drop(_ticket(10**12))] * (16 - len(ops))
            ops += [
                Offer(ticket, "main", f"t{int(ticket, 16) % tenants}", 1.0, (1.0,), 10, 30.0)
                for ticket in fresh
            ]
            await store.sync([(lanes, ops)])
            state["held"] = fresh

        return call

    fair = ModelLimits("f", 64, None, (LaneLimits("main", 64, fair=True),))
    several = [ModelLimits(model, 64, None, (LaneLimits("main", 64),)) for model in spread]

    async def three_models() -> None:
        await store.sync([(lim, [Drop(_ticket(10**12))]) for lim in several])

    return [
        ("ping", store.ping),
        ("sync, 1 op", one_op),
        ("sync, 32 ops", thirty_two_ops(limits, 1)),
        ("sync, 32 ops, vtc x100", thirty_two_ops(fair, 100)),
        ("sync, 3 models", three_models),
        ("take", lambda: store.take(RATES, 100)),
        ("heartbeat, 1 model", lambda: store.heartbeat(["m"])),
    ]


async def _round_trips(
    store: RedisStore, clients: list[aioredis.Redis], calls: int, spread: list[str]
) -> list[tuple[str, Timed]]:
    return [(name, await _timed(clients, call, calls)) for name, call in _cases(store, spread)]


async def _model_bytes(client: aioredis.Redis, model: str) -> tuple[int, int]:
    total = 0
    async for key in client.scan_iter(match=f"{{sluicegate:{model}}}*", count=1000):
        total += int(await client.memory_usage(key, samples=0) or 0)
    info = await client.info("memory")
    return total, int(info["used_memory"])


async def _memory(
    store: RedisStore, client: aioredis.Redis, waiting: int
) -> list[tuple[str, float, float]]:
    cases = [
        ("fifo", False, 1, 1),
        ("vtc, 100 tenants, 3-float order", True, 3, 100),
    ]
    rows = []
    for name, fair, floats, tenants in cases:
        model = f"mem-{len(rows)}"
        limits = ModelLimits(model, 1, None, (LaneLimits("main", 1, fair=fair),))
        await store.sync([(limits, [Offer("f" * 16, "main", "t0", 1.0, (0.0,) * floats, 1, 1.0)])])
        keys_before, used_before = await _model_bytes(client, model)
        for start in range(0, waiting, 500):
            ops = [
                Offer(
                    _ticket(number),
                    "main",
                    f"tenant-{number % tenants:03d}",
                    1.0,
                    (1.7e9 + number * 1e-3,) * floats,
                    700,
                    2100.0,
                )
                for number in range(start, min(waiting, start + 500))
            ]
            await store.sync([(limits, ops)])
        keys_after, used_after = await _model_bytes(client, model)
        rows.append(
            (name, (keys_after - keys_before) / waiting, (used_after - used_before) / waiting)
        )
    return rows


async def _tenant_counts(
    url: str, client: aioredis.Redis, calls: int
) -> list[tuple[int, float, float, float]]:
    limits = ModelLimits("c", 10**6, None, (LaneLimits("a", 10**6), LaneLimits("b", 10**6)))
    replicas = [RedisStore(url, replica=f"{REPLICA}-{i}", timeout_s=5.0) for i in range(3)]
    rows = []
    try:
        for store in replicas:
            await store.connect()
        for running in (0, 1_000, 10_000):
            for i, store in enumerate(replicas):
                leases = [
                    Lease(f"{i}-{k:012x}", "ab"[k % 2], f"tenant-{k % 50:02d}", 1.0, 100)
                    for k in range(running // 3)
                ]
                await store.resync(limits, leases)
            timed = await _timed([client], lambda: replicas[0].counts(limits), calls)
            rows.append((running, *timed[:3]))
    finally:
        for store in replicas:
            await store.close()
    return rows


def _print_round_trips(calls: int, rows: list[tuple[str, Timed]]) -> None:
    print(f"round trips on loopback, {calls} calls each")
    print(f"{'call':<26}{'median ms':>10}{'p99 ms':>10}{'Redis CPU µs':>14}{'client CPU µs':>15}")
    for name, (median, p99, busy_us, cpu_us) in rows:
        print(f"{name:<26}{median:>10.3f}{p99:>10.3f}{busy_us:>14.1f}{cpu_us:>15.1f}")


async def _main(url: str, calls: int, waiting: int) -> None:
    store = RedisStore(url, replica=REPLICA, timeout_s=1.0)
    await store.connect()
    client = aioredis.Redis.from_url(url)
    try:
        _print_round_trips(calls, await _round_trips(store, [client], calls, ["m", "f", "x"]))
        print(f"\nRedis memory per waiting ticket, {waiting} waiting (bytes)")
        print(f"{'case':<36}{'MEMORY USAGE':>14}{'used_memory':>14}")
        for name, by_keys, by_info in await _memory(store, client, waiting):
            print(f"{name:<36}{by_keys:>14.0f}{by_info:>14.0f}")
        print("\nrunning tickets per tenant (counts), leases of 3 replicas")
        print(f"{'running':<26}{'median ms':>10}{'p99 ms':>10}{'Redis CPU µs':>14}")
        for running, median, p99, busy_us in await _tenant_counts(url, client, calls // 10):
            print(f"{running:<26}{median:>10.3f}{p99:>10.3f}{busy_us:>14.1f}")
    finally:
        await client.aclose()
        await store.close()


async def _redis_py_cluster(url: str, spread: list[str], calls: int) -> Timed:
    """``sync`` of three models through redis-py's ``RedisCluster`` pipeline (no Redis CPU)."""
    from redis.asyncio.cluster import RedisCluster

    from sluicegate.store.keys import model_base
    from sluicegate.store.lua import LimitScripts, sync_args

    scripts = LimitScripts()
    scripts.reset()
    client = RedisCluster.from_url(url)
    sha = await client.script_load(scripts["sync"].text)
    several = [ModelLimits(model, 64, None, (LaneLimits("main", 64),)) for model in spread]
    numbers = itertools.count(1)

    async def call() -> None:
        # A new sequence number each time: a repeated one is answered from the fencing record.
        seq = next(numbers)
        pipe = client.pipeline()
        for lim in several:
            args = sync_args(REPLICA, 5000, lim, [], time.time(), seq)
            pipe.execute_command("EVALSHA", sha, 1, model_base("sluicegate", lim.model), *args)
        await pipe.execute()

    try:
        median, p99, _, cpu_us = await _timed([], call, calls)
        return median, p99, float("nan"), cpu_us
    finally:
        await client.aclose()


async def _cluster_main(single_url: str, cluster: RedisCluster, calls: int) -> None:
    from sluicegate.store.keys import model_base

    spread = cluster.keys_on_distinct_masters(3, lambda name: model_base("sluicegate", name))
    single = RedisStore(single_url, replica=REPLICA, timeout_s=1.0)
    clustered = RedisStore(cluster.url, replica=REPLICA, timeout_s=1.0, cluster=True)
    single_client = aioredis.Redis.from_url(single_url)
    masters = [aioredis.Redis(port=port) for port in cluster.masters()]
    await single.connect()
    await clustered.connect()
    try:
        one = dict(_cases(single, spread))
        many = dict(_cases(clustered, spread))
        print(f"round trips on loopback, {calls} calls each: one redis-server | Redis Cluster")
        head = f"{'call':<24}{'median ms':>10}{'p99':>8}{'client µs':>10}"
        print(f"{head} |{'median ms':>10}{'p99':>8}{'client µs':>10}{'Redis µs':>10}")
        for name in one:
            a = await _timed([single_client], one[name], calls)
            b = await _timed(masters, many[name], calls)
            left = f"{name:<24}{a[0]:>10.3f}{a[1]:>8.3f}{a[3]:>10.1f}"
            print(f"{left} |{b[0]:>10.3f}{b[1]:>8.3f}{b[3]:>10.1f}{b[2]:>10.1f}")
        median, p99, _, cpu_us = await _redis_py_cluster(cluster.url, spread, calls)
        name = "sync, 3 models, redis-py"
        print(f"{name:<24}{'':>28} |{median:>10.3f}{p99:>8.3f}{cpu_us:>10.1f}{'—':>10}")
    finally:
        for client in [single_client, *masters]:
            await client.aclose()
        await single.close()
        await clustered.close()


def main() -> None:
    """Parse the arguments, start a private redis-server (and a cluster) and print the tables."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=1000)
    parser.add_argument("--waiting", type=int, default=10_000)
    parser.add_argument("--cluster", action="store_true", help="also on a Redis Cluster")
    args = parser.parse_args()
    with running_redis() as server:
        if not args.cluster:
            asyncio.run(_main(server.url, args.calls, args.waiting))
            return
        with running_cluster() as cluster:
            asyncio.run(_cluster_main(server.url, cluster, args.calls))


if __name__ == "__main__":
    main()
