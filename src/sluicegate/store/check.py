"""``sluicegate check-config --connect``: is the configured shared store reachable?"""

from __future__ import annotations

import time

from sluicegate.config import Config
from sluicegate.store.redis_store import RedisStore


async def check_store(config: Config) -> float:
    """Connect to ``config.store`` and ping it; the round trip in seconds.

    Raises:
        StoreUnavailableError: the store did not answer within the configured timeout.
    """
    settings = config.distributed
    store = RedisStore(
        config.store,
        prefix=settings.key_prefix,
        replica="check-config",
        lease_ttl_s=settings.lease_ttl_s,
        timeout_s=settings.timeout_ms / 1000.0,
    )
    try:
        await store.connect()
        started = time.perf_counter()
        await store.ping()
        return time.perf_counter() - started
    finally:
        await store.close()
