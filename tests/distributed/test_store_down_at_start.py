"""Gateways that start while the store is down (DESIGN §16): they have never counted the
replicas, so none may admit at the whole limits.

With ``distributed.expected_replicas`` a ``fail_open`` gateway keeps 1/expected_replicas of
every limit until the store answers; without it, it refuses with 503
``store_unavailable`` until then. Either way the gateways reach global mode once Redis is
started, and the global cap holds from then on.
"""

from __future__ import annotations

import asyncio
import contextlib
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sluicegate.demo.processes import free_port
from tests.distributed.cluster import ClusterSpec, ModelSetup, lane, running_cluster
from tests.distributed.load import Client, RunningSampler, client
from tests.store.redis_server import RedisServer

pytestmark = pytest.mark.distributed

CAP = 6
REPLICAS = 3
TOKENS = 300  # 3 s on the ``independent`` preset


@contextlib.contextmanager
def redis_not_started() -> Iterator[RedisServer]:
    """A ``redis-server`` on a free port that the test starts when it chooses."""
    with tempfile.TemporaryDirectory(prefix="sluicegate-redis-") as workdir:
        server = RedisServer(free_port(), workdir)
        try:
            yield server
        finally:
            server.kill()


def spec(expected_replicas: int | None) -> ClusterSpec:
    """Three ``fail_open`` gateways, model ``m`` capped at ``CAP``."""
    model = ModelSetup("m", {"max_concurrency": CAP, "lanes": [lane("shared", 64)]})
    extra: dict[str, Any] = {}
    if expected_replicas is not None:
        extra["distributed"] = {"expected_replicas": expected_replicas}
    return ClusterSpec(models=(model,), gateways=REPLICAS, extra=extra)


async def stores(c: Client) -> list[dict[str, Any]]:
    """Each gateway's ``/admin/state`` ``store`` object."""
    return [(await c.admin_state(i))["store"] for i in range(REPLICAS)]


async def wait_global(c: Client, timeout_s: float = 10.0) -> None:
    """Wait until every gateway admits through the store."""
    deadline = time.monotonic() + timeout_s
    while any(store["mode"] != "global" for store in await stores(c)):
        assert time.monotonic() < deadline, await stores(c)
        await asyncio.sleep(0.1)


async def test_with_expected_replicas_a_gateway_keeps_its_share_until_the_store_answers(
    tmp_path: Path,
) -> None:
    """``expected_replicas: 3``, cap 6, Redis down at start: 12 long requests through one
    gateway run 2 at a time (6 / 3) — not 6 — until Redis starts; then the gateways rejoin
    and the engine runs 6, never more."""
    with (
        redis_not_started() as redis,
        running_cluster(spec(REPLICAS), tmp_path, redis) as cluster,
    ):
        async with client(cluster, "m", timeout_s=60.0) as c:
            for store in await stores(c):
                assert (store["mode"], store["replicas"]) == ("fail_open", REPLICAS), store
            sampler = RunningSampler(c)
            sampler.start()
            burst = asyncio.create_task(c.burst(12, gateways=[0], max_tokens=(TOKENS,)))
            await asyncio.sleep(2.0)
            redis.start()
            started = time.monotonic()
            await wait_global(c)
            rejoined_s = time.monotonic() - started
            replies = await burst
            samples = await sampler.stop()
    before = [s.running for s in samples if s.at < started]
    after = [s.running for s in samples if s.at >= started + rejoined_s]
    print(f"before the store: max {max(before)} running; global {rejoined_s:.2f} s after it")
    print(f"after: max {max(after)} running")
    assert max(before) == CAP // REPLICAS, before
    assert max(after) == CAP, after
    assert {r.status for r in replies} == {200}, [(r.status, r.error_code) for r in replies]


async def test_without_expected_replicas_a_gateway_refuses_until_the_store_answers(
    tmp_path: Path,
) -> None:
    """No ``expected_replicas``, ``fail_open``, Redis down at start: requests get 503
    ``store_unavailable`` with ``Retry-After`` and the engine sees none; once Redis starts,
    every gateway is global and a burst over all three is served within the cap."""
    with (
        redis_not_started() as redis,
        running_cluster(spec(None), tmp_path, redis) as cluster,
    ):
        async with client(cluster, "m") as c:
            for store in await stores(c):
                assert (store["mode"], store["on_store_failure"]) == ("fail_closed", "fail_open")
            refused = await c.burst(6, max_tokens=(1,))
            assert cluster.engine_stats("m")["finished_total"] == 0
            redis.start()
            await wait_global(c)
            served = await c.burst(18, max_tokens=(100,))
        stats = cluster.engine_stats("m")
    assert {(r.status, r.error_code) for r in refused} == {(503, "store_unavailable")}
    assert all(int(r.headers["retry-after"]) >= 1 for r in refused)
    assert {r.status for r in served} == {200}, [(r.status, r.error_code) for r in served]
    assert stats["max_running_seen"] == CAP, stats
