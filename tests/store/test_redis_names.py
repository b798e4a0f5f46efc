"""Names: any lane, tenant and model name works; replica ids exclude only '|' and tabs."""

from __future__ import annotations

import math
import re

import pytest

from sluicegate.store.keys import default_replica_id
from sluicegate.store.redis_store import RedisStore
from sluicegate.store.types import Drop, LaneLimits, ModelLimits, Offer
from tests.store.store_helpers import connected_stores, offer


async def test_lane_and_tenant_names_that_would_collide_in_keys_stay_apart(redis_url: str) -> None:
    """Fair lanes "a:b" (tenant "c") and "a" (tenant "b:c") keep separate waiting sets."""
    limits = ModelLimits(
        "model {x}|ü", 1, None, (LaneLimits("a:b", 1, fair=True), LaneLimits("a", 1, fair=True))
    )
    async with connected_stores(redis_url, "r") as (store,):
        ops = [offer("h", lane="a:b", tenant="c")]
        ops += [offer("w1", lane="a:b", tenant="c"), offer("w2", lane="a", tenant="b:c")]
        (first,) = await store.sync([(limits, ops)])
        assert first.granted == ("h",)
        counts = await store.counts(limits)
        assert counts.lanes_waiting == {"a:b": 1, "a": 1}
        (second,) = await store.sync([(limits, [Drop("h")])])
        assert second.granted == ("w1",)
        (third,) = await store.sync([(limits, [Drop("w1")])])
        assert third.granted == ("w2",)


async def test_names_with_separators_spaces_and_unicode(redis_url: str) -> None:
    """Tenants and tickets with '|', ':', spaces and non-ASCII are served and dropped intact."""
    limits = ModelLimits("m", 1, None, (LaneLimits("lane |1|", 1, fair=True),))
    tenants = ["x|y", "ä b:c", "|"]
    async with connected_stores(redis_url, "r") as (store,):
        ops = [
            offer(f"t|{i}", (float(i),), lane="lane |1|", tenant=t) for i, t in enumerate(tenants)
        ]
        (result,) = await store.sync([(limits, ops)])
        served = list(result.granted)
        for _ in tenants[1:]:
            (result,) = await store.sync([(limits, [Drop(served[-1])])])
            served += result.granted
        assert sorted(served) == ["t|0", "t|1", "t|2"]
        (last,) = await store.sync([(limits, [Drop(served[-1])])])
        assert (last.counts.running, last.counts.waiting) == (0, 0)


@pytest.mark.parametrize("replica", ["", "a|b", "a\tb"])
def test_replica_ids_with_separators_are_refused(replica: str) -> None:
    """'|' separates a member's parts: a replica id cannot contain it, nor a tab, nor be empty."""
    with pytest.raises(ValueError, match="replica id"):
        RedisStore("redis://127.0.0.1:1/0", replica=replica)


def test_default_replica_ids_are_unique_and_valid() -> None:
    """hostname-pid-8 hex digits, different at every call."""
    first, second = default_replica_id(), default_replica_id()
    assert first != second
    assert re.fullmatch(r".+-\d+-[0-9a-f]{8}", first)
    RedisStore("redis://127.0.0.1:1/0", replica=first)


async def test_an_empty_sync_sends_nothing(redis_url: str) -> None:
    """No batches: no results (and no round trip needed)."""
    async with connected_stores(redis_url, "r") as (store,):
        assert await store.sync([]) == []


@pytest.mark.parametrize(
    "op",
    [
        Offer("t", "main", "x", 0.0, (0.0,), 1, 1.0),
        Offer("t", "main", "x", 1.0, (0.0,), -1, 1.0),
        Offer("t", "main", "x", 1.0, (0.0,), 1, math.inf),
        Offer("t", "main", "x", 1.0, (math.nan,), 1, 1.0),
        Drop("t", math.nan),
    ],
)
async def test_out_of_range_ops_are_refused_before_sending(
    redis_url: str, op: Offer | Drop
) -> None:
    """A zero weight, negative cost, infinite charge, NaN order or NaN correction: ValueError."""
    async with connected_stores(redis_url, "r") as (store,):
        limits = ModelLimits("m", 1, None, (LaneLimits("main", 1),))
        with pytest.raises(ValueError, match=r"range|negative|NaN|finite"):
            await store.sync([(limits, [op])])
        counts = await store.counts(limits)
        assert (counts.running, counts.waiting, counts.replicas) == (0, 0, 0)
