"""Builders for the store tests: limits, offers and connected ``RedisStore`` instances."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

from sluicegate.store.redis_store import RedisStore
from sluicegate.store.types import LaneLimits, ModelLimits, Offer

MODEL = "m"
LANE = "main"


def model_limits(
    cap: int,
    *lanes: LaneLimits,
    token_budget: int | None = None,
    model: str = MODEL,
) -> ModelLimits:
    """Limits of ``model``; one lane ``main`` as wide as the model unless ``lanes`` are given."""
    return ModelLimits(model, cap, token_budget, lanes or (LaneLimits(LANE, cap),))


def offer(
    ticket: str,
    order: tuple[float, ...] = (0.0,),
    *,
    lane: str = LANE,
    tenant: str = "t",
    weight: float = 1.0,
    cost: int = 10,
    charge: float = 30.0,
) -> Offer:
    """An offer with test defaults (cost 10 tokens, VTC charge 30)."""
    return Offer(ticket, lane, tenant, weight, order, cost, charge)


@contextlib.asynccontextmanager
async def connected_stores(
    url: str, *replicas: str, lease_ttl_s: float = 5.0, timeout_s: float = 0.5
) -> AsyncIterator[list[RedisStore]]:
    """One connected ``RedisStore`` per replica id (a generous timeout: loopback under load)."""
    stores = [
        RedisStore(url, replica=replica, lease_ttl_s=lease_ttl_s, timeout_s=timeout_s)
        for replica in replicas
    ]
    try:
        for store in stores:
            await store.connect()
        yield stores
    finally:
        for store in stores:
            await store.close()
