"""Work summaries through a real Redis (``store/work_summary.py``, ``scripts/work.lua``):
each replica sees the sum of the other live replicas' work, never its own, and a summary
lasts as long as its writer does."""

from __future__ import annotations

import asyncio

import pytest
import redis.asyncio as aioredis
from hypothesis import given
from hypothesis import strategies as st

from sluicegate.core.work_ahead import LaneWork
from sluicegate.store.keys import model_base
from sluicegate.store.redis_store import RedisStore
from sluicegate.store.work_summary import MAX_TENANTS, decode_work, encode_work, exchange_work
from tests.store.redis_cluster import RedisCluster
from tests.store.store_helpers import MODEL, connected_stores

TTL_MS = 300
A_WORK = LaneWork(2, 3.5, 3, 6.0, marks=(((1.0,), 0.0, 2.0), ((2.0, 1.0), 2.0, 4.5)))
B_WORK = LaneWork(1, 1.25, 1, 0.5, marks=(((0.5,), 0.0, 0.5),))
FAIR_WORK = LaneWork(0, 0.0, 2, 3.0, tenants=(("t1", 1.0, (((1.0,), 0.0, 1.0),)), ("t2", 2.0, ())))


def _sessions(*names: str) -> tuple[str, ...]:
    """Session ids as the link names them: ``<replica>.<n>``."""
    return tuple(f"{name}.1" for name in names)


async def test_each_replica_reads_the_others_summed_never_its_own(redis_url: str) -> None:
    """Three live replicas: each reads the sum of the other two per lane (marks kept per
    replica), in every model it asks about, and nothing of its own."""
    async with connected_stores(redis_url, *_sessions("a", "b", "c")) as (a, b, c):
        for store in (a, b, c):
            await store.heartbeat([MODEL, "n"])
        await exchange_work(a, {MODEL: {"x": A_WORK}}, replica="a", ttl_ms=TTL_MS)
        await exchange_work(b, {MODEL: {"x": B_WORK, "y": FAIR_WORK}}, replica="b", ttl_ms=TTL_MS)
        seen = await exchange_work(c, {MODEL: {}, "n": {}}, replica="c", ttl_ms=TTL_MS)
        assert set(seen) == {MODEL}
        x, y = seen[MODEL]["x"], seen[MODEL]["y"]
        assert (x.running, x.running_s, x.waiting, x.waiting_s) == (3, 4.75, 4, 6.5)
        assert x.ahead((0.5,)) == 0.0  # the first waiter of either replica
        assert x.ahead((9.0,)) == 4.5 + 0.5  # after every waiter of both
        assert y.tenants == {"t1": 1.0, "t2": 2.0}
        assert (y.ahead((1.5,), "t1"), y.ahead((1.5,), "t2")) == (1.0, 0.0)
        back = await exchange_work(a, {MODEL: {"x": A_WORK}}, replica="a", ttl_ms=TTL_MS)
        assert set(back[MODEL]) == {"x", "y"}
        assert back[MODEL]["x"].running == B_WORK.running  # b's, not its own


async def test_idle_lanes_are_not_written_and_an_idle_replica_leaves_no_key(
    redis_url: str,
) -> None:
    """A lane with nothing running or queued is not written; a replica whose lanes are all
    idle has no hash, and a replica that became idle stops counting at once."""
    async with connected_stores(redis_url, *_sessions("a", "b")) as (a, b):
        for store in (a, b):
            await store.heartbeat([MODEL])
        idle = LaneWork(0, 0.0, 0, 0.0)
        await exchange_work(a, {MODEL: {"x": A_WORK, "z": idle}}, replica="a", ttl_ms=TTL_MS)
        seen = await exchange_work(b, {MODEL: {}}, replica="b", ttl_ms=TTL_MS)
        assert set(seen[MODEL]) == {"x"}
        await exchange_work(a, {MODEL: {"x": idle}}, replica="a", ttl_ms=TTL_MS)
        assert await exchange_work(b, {MODEL: {}}, replica="b", ttl_ms=TTL_MS) == {}
        async with aioredis.Redis.from_url(redis_url) as client:
            assert not await client.exists(f"{model_base('sluicegate', MODEL)}work:a.1")


async def test_a_dead_replicas_summary_stops_counting_within_one_ttl(redis_url: str) -> None:
    """A replica that stops (no heartbeat, no exchange) stops counting once its liveness
    expires, and its hash expires one TTL after its last write."""
    async with connected_stores(redis_url, *_sessions("a", "b"), lease_ttl_s=TTL_MS / 1000) as (
        a,
        b,
    ):
        for store in (a, b):
            await store.heartbeat([MODEL])
        await exchange_work(a, {MODEL: {"x": A_WORK}}, replica="a", ttl_ms=TTL_MS)
        assert set(await exchange_work(b, {MODEL: {}}, replica="b", ttl_ms=TTL_MS)) == {MODEL}
        await asyncio.sleep(TTL_MS / 1000 + 0.05)
        await b.heartbeat([MODEL])
        assert await exchange_work(b, {MODEL: {}}, replica="b", ttl_ms=TTL_MS) == {}
        async with aioredis.Redis.from_url(redis_url) as client:
            assert not await client.exists(f"{model_base('sluicegate', MODEL)}work:a.1")


async def test_an_earlier_session_of_the_same_replica_is_not_another_replica(
    redis_url: str,
) -> None:
    """After a rejoin (session ``a.2``) the summary ``a.1`` left, still live, is not counted
    by ``a.2``, but is by ``b``; a field another version wrote is skipped."""
    async with connected_stores(redis_url, "a.1", "a.2", "b.1") as (old, new, b):
        for store in (old, new, b):
            await store.heartbeat([MODEL])
        await exchange_work(old, {MODEL: {"x": A_WORK}}, replica="a", ttl_ms=5000)
        assert await exchange_work(new, {MODEL: {}}, replica="a", ttl_ms=5000) == {}
        async with aioredis.Redis.from_url(redis_url) as client:
            await client.hset(f"{model_base('sluicegate', MODEL)}work:a.1", "y", "[1, 2]")
        seen = await exchange_work(b, {MODEL: {}}, replica="b", ttl_ms=5000)
        assert set(seen[MODEL]) == {"x"}
        assert seen[MODEL]["x"].running == A_WORK.running


async def test_on_a_redis_cluster_each_model_is_exchanged_in_its_slot(
    redis_cluster: RedisCluster, cluster_url: str
) -> None:
    """Three models whose keys live on three masters: one exchange publishes to each and
    reads each back (the script touches only keys of its declared key's slot, which Redis
    ≥ 7 enforces for scripts with a flags line)."""
    models = redis_cluster.keys_on_distinct_masters(3, lambda name: model_base("sluicegate", name))
    stores = [
        RedisStore(cluster_url, replica=r, timeout_s=1.0, cluster=True) for r in ("a.1", "b.1")
    ]
    try:
        for store in stores:
            await store.connect()
            await store.heartbeat(models)
        a, b = stores
        await exchange_work(a, {m: {"x": A_WORK} for m in models}, replica="a", ttl_ms=5000)
        seen = await exchange_work(b, {m: {} for m in models}, replica="b", ttl_ms=5000)
    finally:
        for store in stores:
            await store.close()
    assert sorted(seen) == sorted(models)
    assert {seen[m]["x"].waiting_s for m in models} == {A_WORK.waiting_s}


_floats = st.floats(0.0, 1e6, allow_nan=False)
_marks = st.lists(
    st.tuples(st.lists(_floats, min_size=1, max_size=3).map(tuple), _floats, _floats),
    max_size=5,
).map(tuple)
_works = st.builds(
    LaneWork,
    st.integers(0, 1000),
    _floats,
    st.integers(0, 10_000),
    _floats,
    marks=_marks,
    tenants=st.lists(st.tuples(st.text(max_size=8), _floats, _marks), max_size=5).map(tuple),
)


@given(_works)
def test_a_summary_survives_its_encoding(work: LaneWork) -> None:
    """``decode_work(encode_work(w))`` is ``w`` (tenants in order of work, most first)."""
    back = decode_work(encode_work(work))
    ordered = tuple(sorted(work.tenants, key=lambda pair: -pair[1]))
    assert back == LaneWork(
        work.running, work.running_s, work.waiting, work.waiting_s, work.marks, ordered
    )


def test_a_fair_lanes_summary_names_at_most_max_tenants() -> None:
    """Beyond ``MAX_TENANTS`` the tenants with the least work are summed under ``""``."""
    mark = (((1.0,), 0.0, 1.0),)
    tenants = tuple((f"t{i}", float(i), mark) for i in range(MAX_TENANTS + 10))
    back = decode_work(encode_work(LaneWork(0, 0.0, 1, 1.0, tenants=tenants)))
    assert len(back.tenants) == MAX_TENANTS
    assert back.tenants[0] == (f"t{MAX_TENANTS + 9}", float(MAX_TENANTS + 9), mark)
    assert back.tenants[-1] == ("", float(sum(range(11))), ())
    assert sum(seconds for _, seconds, _ in back.tenants) == sum(s for _, s, _ in tenants)


@pytest.mark.parametrize("text", ["", "[1, 2]", '{"a": 1}', "[1, 2, 3, 4, [[1]], []]"])
def test_a_field_that_is_no_summary_is_refused(text: str) -> None:
    """Malformed fields raise ``ValueError`` (the exchange skips them)."""
    with pytest.raises(ValueError, match="not a work summary"):
        decode_work(text)
