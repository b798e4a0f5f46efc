"""Redis paused, killed and restarted: every call fails fast with ``StoreUnavailableError``."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import pytest
import redis.asyncio as aioredis

from sluicegate.store.redis_store import BLOCK_LATENESS_S, RedisStore
from sluicegate.store.store_errors import StoreSessionLostError, StoreUnavailableError
from sluicegate.store.types import Lease, TenantRates
from tests.store.redis_server import REDIS_SERVER, RedisServer, running_redis
from tests.store.store_helpers import MODEL, model_limits, offer

TIMEOUT_S = 0.05
SLACK_S = 0.02
"""What the event loop may add to the timeout (the brief's bound: timeout + 20 ms)."""
RATES = TenantRates(
    "t", requests_per_s=100.0, burst_requests=10.0, tokens_per_s=None, burst_tokens=1.0
)


@pytest.fixture
def server() -> Iterator[RedisServer]:
    """A redis-server of this test's own, which the test may pause, kill and restart."""
    if not __import__("os").path.exists(REDIS_SERVER):
        pytest.skip("redis-server not installed")
    with running_redis() as running:
        yield running


def _calls(store: RedisStore) -> dict[str, Callable[[], Awaitable[Any]]]:
    return {
        "ping": store.ping,
        "sync": lambda: store.sync([(model_limits(1), [offer("t1")])]),
        "take": lambda: store.take(RATES, 1),
        "heartbeat": lambda: store.heartbeat([MODEL]),
        "resync": lambda: store.resync(model_limits(1), [Lease("t0", "main", "t", 1.0, 1)]),
        "counts": lambda: store.counts(model_limits(1)),
        "live_replicas": lambda: store.live_replicas([MODEL]),
    }


async def _all_fail_fast(store: RedisStore) -> None:
    for name, call in _calls(store).items():
        started = time.monotonic()
        with pytest.raises(StoreUnavailableError):
            await call()
        assert time.monotonic() - started <= TIMEOUT_S + SLACK_S, name
    started = time.monotonic()
    with pytest.raises(StoreUnavailableError):
        await store.next_grants([MODEL], block_s=0.1)
    assert time.monotonic() - started <= 0.1 + BLOCK_LATENESS_S + TIMEOUT_S + SLACK_S


async def _all_work(store: RedisStore) -> None:
    for call in _calls(store).values():
        await call()
    assert await store.next_grants([MODEL], block_s=0.1) == []


async def test_a_paused_redis_fails_every_call_within_the_timeout(server: RedisServer) -> None:
    """SIGSTOP: each call (on pooled and new connections) raises within timeout + 20 ms."""
    store = RedisStore(server.url, replica="a", timeout_s=TIMEOUT_S)
    await store.connect()
    try:
        await _all_work(store)
        server.pause()
        try:
            await _all_fail_fast(store)
            await _all_fail_fast(store)  # again, now that every pooled connection was dropped
        finally:
            server.resume()
        await _all_work(store)
    finally:
        await store.close()


async def test_a_restarted_redis_works_again_with_its_scripts_reloaded(server: RedisServer) -> None:
    """SIGKILL then a restart on the same port: calls fail fast; then the restarted, empty
    store says it no longer knows the session (whose resync wrote it in), and once the
    session writes itself in again (as a returning link's new session does) every call
    works, the scripts reloaded."""
    store = RedisStore(server.url, replica="a", timeout_s=TIMEOUT_S)
    await store.connect()
    try:
        await _all_work(store)
        server.kill()
        await _all_fail_fast(store)
        server.start()
        async with aioredis.Redis.from_url(server.url) as client:
            assert await client.script_exists("0" * 40) == [False]
        with pytest.raises(StoreSessionLostError):
            await store.sync([(model_limits(1), [offer("lost")])])
        await store.resync(model_limits(1), [])
        (result,) = await store.sync([(model_limits(1), [offer("fresh")])])
        assert result.granted == ("fresh",)
        await _all_work(store)
    finally:
        await store.close()


async def test_flushed_scripts_are_reloaded_within_one_call(server: RedisServer) -> None:
    """SCRIPT FLUSH between calls costs nothing visible: the next sync still answers."""
    store = RedisStore(server.url, replica="a", timeout_s=TIMEOUT_S)
    await store.connect()
    try:
        async with aioredis.Redis.from_url(server.url) as client:
            await client.script_flush()
        (result,) = await store.sync([(model_limits(1), [offer("x")])])
        assert result.granted == ("x",)
        assert await store.take(RATES, 0) == 0.0
    finally:
        await store.close()


async def test_connect_to_nothing_raises(server: RedisServer) -> None:
    """``connect`` to a port nobody listens on raises ``StoreUnavailableError`` quickly."""
    server.kill()
    store = RedisStore(server.url, replica="a", timeout_s=TIMEOUT_S)
    started = time.monotonic()
    with pytest.raises(StoreUnavailableError):
        await store.connect()
    assert time.monotonic() - started <= TIMEOUT_S + SLACK_S
    await store.close()


async def test_close_does_not_wait_for_a_paused_redis(server: RedisServer) -> None:
    """Closing with connections open to a frozen server returns at once, and reconnecting works."""
    store = RedisStore(server.url, replica="a", timeout_s=TIMEOUT_S)
    await store.connect()
    await _all_work(store)
    server.pause()
    try:
        started = time.monotonic()
        await store.close()
        assert time.monotonic() - started <= TIMEOUT_S + SLACK_S
        with pytest.raises(StoreUnavailableError):
            await store.connect()
    finally:
        server.resume()
    await store.connect()
    await _all_work(store)
    await store.close()
