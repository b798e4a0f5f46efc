"""``PressureLease`` on a real redis-server: one holder at a time, renewed by its holder only,
taken over once it runs out or is released; a stage published only by the holder, read
back with its age; every failure a ``StoreUnavailableError`` within the timeout."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable

import pytest
import redis

from sluicegate.store.pressure_lease import PressureLease, PublishedStage, pressure_keys
from sluicegate.store.store_errors import StoreUnavailableError
from tests.store.redis_server import RedisServer

LEASE_S = 0.4
TIMEOUT_S = 0.2
STAGE = PublishedStage(2, 5.0, True, None, {"backlog": 12.5, "empty": None})

Leases = Callable[[str], PressureLease]


@pytest.fixture
async def lease_of(redis_url: str) -> AsyncIterator[Leases]:
    """Leases of replicas on the test's Redis (prefix ``t``), closed at the end."""
    made: list[PressureLease] = []

    def make(replica: str) -> PressureLease:
        lease = PressureLease(
            redis_url, prefix="t", replica=replica, lease_s=LEASE_S, timeout_s=TIMEOUT_S
        )
        made.append(lease)
        return lease

    yield make
    for lease in made:
        await lease.close()


async def test_the_first_claim_holds_and_others_see_the_holder(lease_of: Leases) -> None:
    """A free lease goes to the first claimant (nothing published yet); others read it."""
    a, b = lease_of("a"), lease_of("b")
    first = await a.claim()
    assert (first.holder, first.published) == ("a", None)
    assert (await b.claim()).holder == "a"
    assert (await a.claim()).holder == "a"


async def test_only_the_holder_publishes_and_the_others_read_it(lease_of: Leases) -> None:
    """A non-holder's stage is refused; the holder's is read back whole, with its age."""
    a, b = lease_of("a"), lease_of("b")
    await a.claim()
    assert await b.publish(PublishedStage(1, 1.0, False, "nope", {})) is False
    assert await a.publish(STAGE) is True
    await asyncio.sleep(0.05)
    read = await b.claim()
    assert read.published == STAGE
    assert 0.04 <= read.age_s < 1.0, read.age_s


async def test_the_holder_renews_and_a_lapsed_lease_is_taken_over(lease_of: Leases) -> None:
    """Renewed every 0.2 s, a 0.4 s lease stays; left alone, another replica takes it, and
    the old holder can no longer publish."""
    a, b = lease_of("a"), lease_of("b")
    await a.claim()
    for _ in range(4):  # 0.8 s: twice the lease
        await asyncio.sleep(LEASE_S / 2)
        assert (await a.claim()).holder == "a"
        assert (await b.claim()).holder == "a"
    await asyncio.sleep(LEASE_S + 0.1)
    assert (await b.claim()).holder == "b"
    assert (await a.claim()).holder == "b"
    assert await a.publish(STAGE) is False


async def test_a_released_lease_goes_at_once_and_only_its_holder_releases(
    lease_of: Leases,
) -> None:
    """Only the holder's release deletes the lease; then another replica takes it at once."""
    a, b = lease_of("a"), lease_of("b")
    await a.claim()
    assert await b.release() is False
    assert (await b.claim()).holder == "a"
    assert await a.release() is True
    assert (await b.claim()).holder == "b"


async def test_close_hands_the_lease_over(lease_of: Leases) -> None:
    """A holder that closes gives the lease up: the next claim takes it."""
    a, b = lease_of("a"), lease_of("b")
    await a.claim()
    await a.close()
    assert (await b.claim()).holder == "b"


async def test_the_keys_share_one_hash_tag_and_expire(lease_of: Leases, redis_url: str) -> None:
    """Both keys are under ``{t}`` (one cluster slot); the lease expires within ``lease_s``
    and the stage within two leases."""
    lease_key, stage_key = pressure_keys("t")
    assert (lease_key, stage_key) == ("{t}:pressure:poller", "{t}:pressure:stage")
    a = lease_of("a")
    await a.claim()
    await a.publish(STAGE)
    with redis.Redis.from_url(redis_url) as client:
        assert 0 < client.pttl(lease_key) <= LEASE_S * 1000
        assert LEASE_S * 1000 < client.pttl(stage_key) <= 2 * LEASE_S * 1000


async def test_a_stage_that_is_not_one_reads_as_none(lease_of: Leases, redis_url: str) -> None:
    """A stage hash this version cannot read is no stage (the replica keeps its own)."""
    with redis.Redis.from_url(redis_url) as client:
        client.hset(pressure_keys("t")[1], mapping={"stage": '{"stage": "x"}', "at": 0})
    assert (await lease_of("a").claim()).published is None


async def test_a_paused_store_fails_within_the_timeout(
    lease_of: Leases, redis_server: RedisServer
) -> None:
    """SIGSTOPped Redis: the claim fails as ``StoreUnavailableError`` within its timeout."""
    a = lease_of("a")
    await a.claim()
    redis_server.pause()
    try:
        started = time.monotonic()
        with pytest.raises(StoreUnavailableError):
            await a.claim()
        assert time.monotonic() - started < TIMEOUT_S + 0.15
    finally:
        redis_server.resume()


async def test_an_unreachable_store_fails_at_once() -> None:
    """Nothing listening: ``StoreUnavailableError``, and close does not raise."""
    lease = PressureLease(
        "redis://127.0.0.1:1/0", prefix="t", replica="a", lease_s=LEASE_S, timeout_s=TIMEOUT_S
    )
    with pytest.raises(StoreUnavailableError):
        await lease.claim()
    await lease.close()
