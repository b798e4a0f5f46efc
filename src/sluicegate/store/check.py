"""``sluicegate check-config --connect``: is the configured shared store reachable?"""

from __future__ import annotations

import time

from sluicegate.store.redis_store import RedisStore


async def check_store(store: RedisStore) -> float:
    """Connect to ``store`` and ping it; the round trip in seconds. The store is closed after.

    Raises:
        StoreUnavailableError: the store did not answer within its timeout.
    """
    try:
        await store.connect()
        started = time.perf_counter()
        await store.ping()
        return time.perf_counter() - started
    finally:
        await store.close()
