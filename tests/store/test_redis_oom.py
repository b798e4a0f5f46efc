"""The limit scripts on a real redis-server that is at its ``maxmemory`` (issue 27, finding 3).

Redis refuses writes that could grow it once ``used_memory`` passes ``maxmemory``
(``-OOM``); a script without flags is refused at its first such write. Batch data (or
anything else) filling a shared Redis then took the limits with it: every sync, take
and heartbeat failed and every replica fell back. The scripts carry
``#!lua flags=allow-oom``, so the limits keep working while other writes stay refused.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
import redis
from redis.exceptions import OutOfMemoryError

from sluicegate.store.keys import rate_key
from sluicegate.store.types import Drop, Lease, Refund, TenantRates
from tests.store.redis_server import REDIS_SERVER, RedisServer, running_redis
from tests.store.store_helpers import MODEL, connected_stores, model_limits, offer

pytestmark = pytest.mark.skipif(
    not os.path.exists(REDIS_SERVER),
    reason=f"redis-server not installed ({REDIS_SERVER}); `make test` installs it",
)


@pytest.fixture
def full_redis() -> Iterator[RedisServer]:
    """A redis-server with ``maxmemory`` (``noeviction``) that other data filled past it."""
    args = ["--maxmemory", "8mb", "--maxmemory-policy", "noeviction"]
    with running_redis(args=args) as server:
        fill(server.url)
        yield server


def fill(url: str) -> None:
    """Write 64 KiB values until Redis answers ``OOM``, then lower ``maxmemory`` 1 MiB below
    what it uses: at the edge, a connection closing frees enough for small writes to pass
    again (a command's own buffer counts), and this test needs Redis clearly over."""
    with redis.Redis.from_url(url) as client:
        for index in range(10_000):
            try:
                client.set(f"filler:{index}", b"x" * 65_536)
            except OutOfMemoryError:
                break
        used = int(client.info("memory")["used_memory"])
        client.config_set("maxmemory", str(used - 1024 * 1024))


def refuses_writes(url: str) -> bool:
    """Whether a small plain write is refused with ``OOM`` now."""
    with redis.Redis.from_url(url) as client:
        try:
            client.set("probe", b"1")
        except OutOfMemoryError:
            return True
        client.delete("probe")
        return False


RATES = TenantRates("t", 100.0, 100.0, 10.0, 1000.0)


async def test_limits_keep_working_while_redis_refuses_writes(full_redis: RedisServer) -> None:
    """At ``maxmemory``: offers are granted and queued by the global cap, drops free their
    slot for the next waiter, rate takes charge the bucket and refunds give back, the
    heartbeat and a resync run, scripts Redis lost are loaded again and a new session
    connects — and plain writes are still refused (nothing lifted the limit)."""
    url = full_redis.url
    assert refuses_writes(url)
    async with connected_stores(url, "a", "b") as (a, b):
        limits = model_limits(2)
        (first,) = await a.sync([(limits, [offer("a1"), offer("a2"), offer("a3")])])
        assert first.granted == ("a1", "a2")
        assert first.counts.running == 2
        assert first.counts.waiting == 1
        (second,) = await b.sync([(limits, [offer("b1", (9.0,))])])
        assert second.granted == ()
        assert second.counts.waiting == 2
        (third,) = await a.sync([(limits, [Drop("a1")])])
        assert third.granted == ("a3",)
        assert await a.take(RATES, 600) == 0.0
        assert await a.take(RATES, 600) > 0.0  # 1,000-token burst: the second must wait
        await a.sync([(limits, [Refund(RATES, 500)])])
        assert await a.take(RATES, 400) == 0.0
        assert await a.heartbeat([MODEL]) == 2
        assert await b.live_replicas([MODEL]) == {"a", "b"}
        await b.resync(limits, [Lease("b9", "main", "t", 1.0, 10)])
        counts = await a.counts(limits)
        assert counts.running == 3  # a2, a3 and b's lease written back
        with redis.Redis.from_url(url) as client:
            client.script_flush()  # as after a restart: the next calls reload the scripts
        (fourth,) = await a.sync([(limits, [Drop("a2")])])
        assert fourth.counts.running == 2  # b1 left with b's resync; nothing waits
    async with connected_stores(url, "c") as (c,):  # a new session connects (SCRIPT LOAD)
        assert await c.heartbeat([MODEL]) == 3
    with redis.Redis.from_url(url) as client:
        assert client.exists(rate_key("sluicegate", "t"))
    assert refuses_writes(url)
