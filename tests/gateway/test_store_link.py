"""Distributed mode in process: two gateways on one real ``redis-server`` and one emulator.

What the multi-process tests (``tests/distributed``) measure at scale, checked here
rule by rule: the store's view in ``/admin/state`` and ``/metrics``, a slot freed on
one gateway going to a request waiting on the other, and the fallback and return
when Redis stops answering.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from contextlib import ExitStack

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.gateway.gateway_harness import (
    ADMIN_KEY,
    MODEL,
    Stack,
    admin_state,
    engine_server,
    gateway_at,
    http_call,
    openai_error,
    wait_until,
)
from tests.store.redis_server import RedisServer, running_redis

SMALL = {"model": MODEL, "prompt": "hi", "max_tokens": 2, "ignore_eos": True}


def _body(redis: RedisServer, replica: str, failure: str = "fail_open") -> str:
    return (
        "    max_concurrency: 1\n"
        "    lanes:\n      - {name: interactive, max_concurrency: 1, max_queue: 64}\n"
        f"store: redis://127.0.0.1:{redis.port}/0\n"
        f"distributed: {{replica_id: {replica}, on_store_failure: {failure},"
        " lease_ttl_s: 1.0, timeout_ms: 100}\n"
    )


@pytest.fixture
def pair() -> Iterator[tuple[RedisServer, Stack, Stack]]:
    """Redis, one emulated engine and two gateways (cap 1) sharing the store."""
    with ExitStack() as stack:
        redis = stack.enter_context(running_redis())
        engine = stack.enter_context(engine_server())
        ports = [engine.port]
        first = stack.enter_context(gateway_at(ports, _body(redis, "gw-a")))
        second = stack.enter_context(gateway_at(ports, _body(redis, "gw-b")))
        yield redis, first, second


def _metrics(base_url: str) -> dict[str, float]:
    text = http_call(base_url, "GET", "/metrics").body.decode()
    values: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name.startswith("sluicegate_store"):
                labels = ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items()))
                values[f"{sample.name}{{{labels}}}"] = sample.value
    return values


def test_state_and_metrics_show_the_global_view(
    pair: tuple[RedisServer, Stack, Stack],
) -> None:
    """``/admin/state`` names the store's mode, the replica and its session and counts both
    replicas, and its global counts return to idle after a request (the next sync); the
    store gauges read global mode."""
    _, first, second = pair
    assert http_call(first.base_url, "POST", "/v1/completions", json=SMALL).status == 200
    store = admin_state(first.base_url)["store"]
    assert store["kind"] == "redis"
    assert store["mode"] == "global"
    assert (store["replica"], store["session"]) == ("gw-a", "gw-a.1")
    assert store["on_store_failure"] == "fail_open"
    assert wait_until(lambda: admin_state(first.base_url)["store"]["replicas"] == 2, 3.0)
    idle = {"running": 0, "waiting": 0, "inflight_tokens": 0}
    assert wait_until(lambda: admin_state(first.base_url)["store"]["global"][MODEL] == idle, 3.0)
    # gw-b served nothing: its heartbeat's fill (every lease_ttl_s / 4) is its first sync.
    sync_count = "sluicegate_store_round_trip_seconds_count{op=sync}"
    assert wait_until(lambda: _metrics(second.base_url).get(sync_count, 0.0) >= 1.0, 2.0)
    metrics = _metrics(second.base_url)
    assert metrics["sluicegate_store_global{}"] == 1.0
    assert metrics["sluicegate_store_replicas{}"] == 2.0
    assert metrics["sluicegate_store_transitions_total{mode=global}"] == 1.0
    assert metrics["sluicegate_store_global_running{model=tiny}"] == 0.0


async def _stream_until_done(base_url: str, max_tokens: int) -> float:
    body = {"model": MODEL, "prompt": "hi", "max_tokens": max_tokens, "ignore_eos": True}
    async with (
        aiohttp.ClientSession() as session,
        session.post(f"{base_url}/v1/completions", json=body) as response,
    ):
        assert response.status == 200
        await response.read()
    return time.monotonic()


async def _waited(base_url: str) -> tuple[float, float]:
    """Send a small request; when it was sent and how long it queued (seconds)."""
    sent = time.monotonic()
    async with (
        aiohttp.ClientSession() as session,
        session.post(f"{base_url}/v1/completions", json=SMALL) as response,
    ):
        assert response.status == 200
        await response.read()
        return sent, float(response.headers["x-sluicegate-queue-ms"]) / 1000.0


async def test_a_slot_freed_on_one_gateway_goes_to_a_request_waiting_on_the_other(
    pair: tuple[RedisServer, Stack, Stack],
) -> None:
    """Cap 1 shared: while gw-a runs a long request, gw-b's request waits (it never runs
    alongside it), and it is admitted once gw-a's ends: the store grants the freed slot to
    gw-b, whose listener admits it at once (without the listener it waits out its queue
    timeout). Over five hand-offs the median is under 50 ms."""
    _, first, second = pair

    def gw_a_runs() -> bool:
        return bool(admin_state(first.base_url)["models"][0]["running"] == 1)

    hand_offs = []
    for _ in range(5):
        long_request = asyncio.create_task(_stream_until_done(first.base_url, 150))
        assert await asyncio.to_thread(wait_until, gw_a_runs, 5.0)
        sent, queued_s = await _waited(second.base_url)
        ended_at = await long_request
        admitted_at = sent + queued_s
        assert admitted_at >= ended_at - 0.05, "gw-b ran while gw-a held the only slot"
        hand_offs.append(admitted_at - ended_at)
    hand_offs.sort()
    assert hand_offs[2] < 0.05, f"hand-offs {[round(h, 3) for h in hand_offs]} s"


def test_fail_closed_refuses_with_store_unavailable_then_returns(
    pair: tuple[RedisServer, Stack, Stack],
) -> None:
    """With Redis paused, a fail-closed gateway answers 503 ``store_unavailable`` with
    ``Retry-After`` within its timeout (plus slack), exports the transition, and serves
    again in global mode after Redis resumes."""
    redis, _, _ = pair
    engine_port = pair[1].engine_ports[0]
    with gateway_at([engine_port], _body(redis, "gw-c", "fail_closed")) as closed:
        assert http_call(closed.base_url, "POST", "/v1/completions", json=SMALL).status == 200
        redis.pause()
        try:
            started = time.monotonic()
            reply = http_call(closed.base_url, "POST", "/v1/completions", json=SMALL)
            elapsed = time.monotonic() - started
            assert reply.status == 503
            assert openai_error(reply)["code"] == "store_unavailable"
            assert reply.headers["retry-after"] == "1"
            assert elapsed < 0.1 + 0.6, f"the refusal took {elapsed:.3f} s"
            assert admin_state(closed.base_url)["store"]["mode"] == "fail_closed"
        finally:
            redis.resume()
        assert wait_until(lambda: admin_state(closed.base_url)["store"]["mode"] == "global", 5.0), (
            "never returned to global mode"
        )
        metrics = _metrics(closed.base_url)
        assert metrics["sluicegate_store_transitions_total{mode=fail_closed}"] == 1.0
        assert metrics["sluicegate_store_transitions_total{mode=global}"] == 2.0
        assert http_call(closed.base_url, "POST", "/v1/completions", json=SMALL).status == 200


def test_memory_store_state_says_so() -> None:
    """Without a shared store ``/admin/state`` says the state is in memory."""
    with engine_server() as engine, gateway_at([engine.port]) as gateway:
        reply = http_call(gateway.base_url, "GET", "/admin/state", key=ADMIN_KEY)
        assert reply.json()["store"] == {"kind": "memory"}


def test_a_large_outbox_goes_in_syncs_of_at_most_256_ops_in_order() -> None:
    """Thousands of offers (a rejoin with a long queue) are sent in several round trips of
    at most ``MAX_OPS_PER_SYNC`` operations, each model's in the order they were sent."""
    from sluicegate.config import parse_config
    from sluicegate.core.scheduler import Scheduler
    from sluicegate.gateway.distributed.link_modes import MAX_OPS_PER_SYNC
    from sluicegate.gateway.distributed.store_link import StoreLink
    from sluicegate.store.redis_store import RedisStore
    from sluicegate.store.types import Drop

    config = parse_config("models: [{name: m1}, {name: m2}]\nstore: redis://127.0.0.1:1/0\n")
    link = StoreLink(
        lambda replica: RedisStore(config.store, replica=replica),
        "gw",
        config.distributed,
        Scheduler(config.scheduler_spec()),
        {},
    )
    sent = {
        model: [Drop(f"{model}-{i}") for i in range(n)] for model, n in (("m1", 400), ("m2", 200))
    }
    link._outbox = {model: list(ops) for model, ops in sent.items()}
    received: dict[str, list[object]] = {"m1": [], "m2": []}
    sizes = []
    while link._outbox:
        batch = link._next_batch()
        sizes.append(sum(len(ops) for _, ops in batch))
        for model, ops in batch:
            received[model] += ops
    assert MAX_OPS_PER_SYNC == 256
    assert sizes == [256, 256, 88]
    assert received == sent
