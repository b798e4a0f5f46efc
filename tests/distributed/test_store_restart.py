"""A store that lost a replica's state while the replica's requests run: the replica must
write them back, or the store grants their slots again.

Two ways to lose it: Redis killed and started again at once, empty (the replicas' lost
connections send them to the fallback, and they rejoin); and a replica paused longer than
two lease TTLs, which the others' heartbeats reap as dead while it keeps its connection
(its next heartbeat or sync hears that the store no longer knows its session).
"""

from __future__ import annotations

import asyncio
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from tests.distributed.cluster import ClusterSpec, ModelSetup, lane, running_cluster
from tests.distributed.load import client
from tests.distributed.preempt_scenario import CAP, fill_engine
from tests.store.redis_server import RedisServer

pytestmark = pytest.mark.distributed


def global_running(state: dict[str, Any]) -> int | None:
    """The store's running count for model ``m`` a replica last saw (``None``: not global)."""
    store = state["store"]
    if store.get("mode") != "global":
        return None
    counts = store.get("global", {}).get("m")
    return None if counts is None else int(counts["running"])


async def test_a_store_restarted_empty_gets_the_running_requests_back(tmp_path: Path) -> None:
    """Four 4 s requests hold the cap of 4 over three replicas; Redis is killed and
    restarted empty. Within 3 s every replica is global again and the store counts the 4
    running; four more requests then wait for them (the engine never runs more than 4)."""
    model = ModelSetup("m", {"max_concurrency": CAP, "lanes": [lane("shared", CAP)]})
    spec = ClusterSpec(models=(model,), gateways=3)
    with running_cluster(spec, tmp_path) as cluster:
        assert isinstance(cluster.redis, RedisServer)
        async with client(cluster, "m") as c:
            first = await fill_engine(c, [0, 1, 2], tenant=None, settle_s=0.0)
            cluster.redis.kill()
            cluster.redis.start()
            restarted = time.monotonic()
            seen: list[int | None] = [None] * 3
            while time.monotonic() - restarted < 3.0:
                seen = [global_running(await c.admin_state(i)) for i in range(3)]
                if seen == [CAP] * 3:
                    break
                await asyncio.sleep(0.05)
            back_s = time.monotonic() - restarted
            second = [asyncio.create_task(c.send(i % 3, max_tokens=5)) for i in range(CAP)]
            replies = await asyncio.gather(*first, *second)
            stats = await c.engine_stats()
    print(f"store restarted empty: replicas counted the {CAP} running again in {back_s:.2f} s")
    assert seen == [CAP] * 3, seen
    assert [r.status for r in replies] == [200] * (2 * CAP)
    assert stats["max_running_seen"] <= CAP, stats


async def test_a_replica_reaped_while_paused_writes_its_requests_back(tmp_path: Path) -> None:
    """gw1 runs four 8 s requests (the cap) and is paused (SIGSTOP) for 5 s, more than two
    lease TTLs of 2 s: gw2's heartbeat reaps it, and the store counts nothing running. Once
    gw1 resumes, within 3 s the store counts its 4 running again (it learned at its next
    call that the store had dropped its session, and rejoined)."""
    model = ModelSetup("m", {"max_concurrency": CAP, "lanes": [lane("shared", CAP)]})
    spec = ClusterSpec(models=(model,), gateways=2)
    with running_cluster(spec, tmp_path) as cluster:
        async with client(cluster, "m") as c:
            held = await fill_engine(c, [0], tenant=None, max_tokens=800, settle_s=0.0)
            cluster.gateways[0].signal_group(signal.SIGSTOP)
            await asyncio.sleep(5.0)
            while_paused = global_running(await c.admin_state(1))
            cluster.gateways[0].signal_group(signal.SIGCONT)
            resumed = time.monotonic()
            counted = while_paused
            while time.monotonic() - resumed < 3.0 and counted != CAP:
                await asyncio.sleep(0.1)
                counted = global_running(await c.admin_state(1))
            back_s = time.monotonic() - resumed
            for task in held:
                task.cancel()
    print(f"reaped while paused: the store counted {while_paused}, {counted} {back_s:.2f} s after")
    assert while_paused == 0
    assert counted == CAP
