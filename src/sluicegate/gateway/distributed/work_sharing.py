"""Work sharing (DESIGN §16): while the link is global, every ``WORK_PERIOD_S`` this
replica publishes the work in its shedding lanes to the store and hands the other live
replicas' back to its scheduler, whose start estimates (shedding, ``Retry-After`` of
``overloaded``) then count the whole fleet's work, not this replica's alone.

The task owns no state a failure could lose: an exchange that fails or times out is
skipped, and the sums it had stand until the next one replaces them, or one lease TTL
without a successful exchange clears them. Whether the store is lost is for the syncs
and the heartbeat to decide; the fallback clears the sums (``Scheduler.lose_store``).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Coroutine, Sequence
from typing import Any

from sluicegate.core.scheduler import Scheduler
from sluicegate.gateway.distributed.link_modes import WORK_PERIOD_S, StoreClient
from sluicegate.store.redis_store import RedisStore
from sluicegate.store.store_errors import StoreUnavailableError
from sluicegate.store.work_summary import exchange_work


async def share_work(
    store: RedisStore,
    scheduler: Scheduler,
    clock: Callable[[], float],
    models: Sequence[str],
    *,
    replica: str,
    ttl_ms: int,
    observe: Callable[[str, float], None],
) -> None:
    """Exchange work summaries of ``models`` (those with a shedding lane) every
    ``WORK_PERIOD_S`` through ``store`` until cancelled (the link's fallback or close).

    ``clock`` is the driver's; ``replica`` this replica's id without its session;
    ``observe(op, started)`` records a round trip.
    """
    last_ok = clock()
    while True:
        await asyncio.sleep(WORK_PERIOD_S)
        now = clock()
        local = {model: scheduler.work_summary(model, now) for model in models}
        started = time.perf_counter()
        try:
            remote = await exchange_work(store, local, replica=replica, ttl_ms=ttl_ms)
        except StoreUnavailableError:
            if now - last_ok <= ttl_ms / 1000.0:
                continue
            remote = {}
        else:
            last_ok = now
            observe("work", started)
        for model in models:
            scheduler.set_remote_work(model, remote.get(model, {}))


def work_sharing(
    store: RedisStore,
    scheduler: Scheduler,
    client: StoreClient | None,
    lease_ttl_s: float,
    observe: Callable[[str, float], None],
) -> Coroutine[Any, Any, None] | None:
    """A session's ``share_work`` on ``store`` for the models with a shedding lane (``None``
    when no lane sheds, or without a driver), on the driver's clock; summaries outlive
    their writer by ``lease_ttl_s``."""
    models = [
        model.name
        for model in scheduler.spec.models
        if any(lane.shed_hopeless for lane in model.lanes)
    ]
    if not models or client is None:
        return None
    replica = store.replica.rpartition(".")[0] or store.replica
    ttl_ms = max(1, round(lease_ttl_s * 1000.0))
    return share_work(
        store, scheduler, client.now, models, replica=replica, ttl_ms=ttl_ms, observe=observe
    )
