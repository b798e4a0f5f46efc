"""The grant listener: a wait given up leaves what comes next in Redis for the next one
(that nothing popped is dropped across calls: ``test_redis_cluster.py``, where each slot
has a pop of its own)."""

from __future__ import annotations

import asyncio
import contextlib

import redis

from sluicegate.store.keys import grants_key
from sluicegate.store.types import Drop
from tests.store.store_helpers import MODEL, connected_stores, model_limits, offer


async def test_a_cancelled_wait_leaves_the_next_grant_in_redis(redis_url: str) -> None:
    """B's wait is cancelled, then A's release grants B's waiter: the abandoned blocking
    pop does not take the grant (its connection is dropped, so Redis unblocks it, rather
    than hand the grant to a reply nobody may read: the link drops a store it fell back
    from); it waits in B's list for B's next call."""
    async with connected_stores(redis_url, "a", "b") as (a, b):
        await a.sync([(model_limits(1), [offer("x")])])
        await b.sync([(model_limits(1), [offer("y")])])
        abandoned = asyncio.create_task(b.next_grants([MODEL], block_s=5.0))
        await asyncio.sleep(0.05)
        abandoned.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await abandoned
        await asyncio.sleep(0.05)
        await a.sync([(model_limits(1), [Drop("x")])])
        with redis.Redis.from_url(redis_url, decode_responses=True) as client:
            assert client.lrange(grants_key("sluicegate", MODEL, "b"), 0, -1) == ["y"]
        assert await b.next_grants([MODEL], block_s=1.0) == [(MODEL, "y")]
