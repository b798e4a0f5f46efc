"""Backend health over real HTTP (DESIGN §8): active probes, the passive circuit, and engines
that die while they serve.

Circuit cool-downs pass on the gateway's scheduling clock (``clock_harness``): the test
advances it instead of sleeping, while the requests, the engines and the failures are real.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import aiohttp
import orjson
import pytest

from tests.gateway.clock_harness import clocked_gateway
from tests.gateway.gateway_harness import (
    FAST_PRIORS,
    MODEL,
    EngineServer,
    Stack,
    backend_state,
    engine_server,
    gateway_at,
    model_state,
    open_stream,
    read_events,
    unused_port,
    wait_until,
)

INTERVAL_S = 0.2
ACTIVE = f"""    max_concurrency: 8
{FAST_PRIORS}server: {{scrape_interval_s: {INTERVAL_S}}}
"""
COOLDOWN_S = 60.0
SLACK_S = 5.0  # real time the test itself may take, well within the cool-down
PASSIVE = f"""    max_concurrency: 8
    circuit_failures: 2
    circuit_cooldown_s: {COOLDOWN_S}
{FAST_PRIORS}"""
ONE_STRIKE = f"""    max_concurrency: 8
    circuit_failures: 1
    circuit_cooldown_s: 30
{FAST_PRIORS}server: {{scrape_interval_s: {INTERVAL_S}}}
"""
SMALL = {"model": MODEL, "prompt": "health", "max_tokens": 2, "ignore_eos": True}


async def _statuses(gateway: Stack, count: int, *, concurrent: bool = False) -> list[int]:
    """Statuses of ``count`` short completions, sent one after another or all at once."""
    url = gateway.base_url + "/v1/completions"
    async with aiohttp.ClientSession() as session:

        async def one() -> int:
            async with session.post(url, json=SMALL) as reply:
                await reply.read()
                return reply.status

        if concurrent:
            return list(await asyncio.gather(*(one() for _ in range(count))))
        return [await one() for _ in range(count)]


def _healthy(gateway: Stack, backend: str) -> bool:
    return bool(backend_state(gateway.base_url, backend)["healthy"])


async def _until(predicate: Callable[[], bool], within_s: float) -> bool:
    return await asyncio.to_thread(wait_until, predicate, within_s)


async def test_killed_replica_is_routed_around_within_one_probe_interval() -> None:
    """When one of two engines goes down, the active probe marks it unhealthy within about
    one ``scrape_interval_s`` (allowing 1 s), after which every request succeeds on the
    other engine."""
    with (
        engine_server() as e0,
        engine_server(seed=1) as e1,
        gateway_at([e0.port, e1.port], ACTIVE) as gateway,
    ):
        e1.stop()
        start = time.monotonic()
        noticed = await _until(lambda: not _healthy(gateway, "e1"), 2.0)
        took = time.monotonic() - start
        statuses = await _statuses(gateway, 20)
        admitted = e0.stats()["admitted_total"]
    assert noticed, "the dead engine still counts as healthy"
    assert took < 1.0
    assert statuses == [200] * 20
    assert admitted == 20


async def test_replica_that_returns_is_readmitted() -> None:
    """An engine that went down and comes back on the same address is probed healthy again
    and gets its share of new requests: half of the ten sent one after another, since the
    router (``least_inflight``) makes idle backends take turns."""
    with (
        engine_server() as e0,
        engine_server(seed=1) as e1,
        gateway_at([e0.port, e1.port], ACTIVE) as gateway,
    ):
        e1.stop()
        assert await _until(lambda: not _healthy(gateway, "e1"), 1.0)
        e1.start()
        back = await _until(lambda: _healthy(gateway, "e1"), 1.0)
        statuses = await _statuses(gateway, 10)
        returned = e1.stats()["admitted_total"]
    assert back
    assert statuses == [200] * 10
    assert returned == 5


async def test_a_refused_connection_opens_the_circuit() -> None:
    """With ``circuit_failures: 2`` and no active probing, a backend whose port refuses
    connections is marked down by the first refusal, and the refused request goes to the
    live engine: every request succeeds and the circuit is open."""
    with engine_server() as e0, gateway_at([e0.port, unused_port()], PASSIVE, scrape=False) as gw:
        statuses = await _statuses(gw, 12)
        circuit = backend_state(gw.base_url, "e1")["circuit"]
    assert statuses == [200] * 12
    assert circuit == "open"


async def test_half_open_circuit_lets_exactly_one_probe_through(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """An open circuit stays open until ``circuit_cooldown_s`` has passed on the gateway's
    clock, then lets a single request through: of eight requests sent at once, exactly one
    reaches the still-dead backend (its refusal is logged once), which opens the circuit
    again; that one goes to the live engine too, so all eight succeed."""
    with (
        engine_server() as e0,
        clocked_gateway([e0.port, unused_port()], PASSIVE, scrape=False) as (gw, clock),
    ):
        opened = await _statuses(gw, 8)
        clock.advance(COOLDOWN_S - SLACK_S)
        still_open = backend_state(gw.base_url, "e1")["circuit"]
        clock.advance(SLACK_S)
        cooled = backend_state(gw.base_url, "e1")["circuit"]
        caplog.clear()
        burst = await _statuses(gw, 8, concurrent=True)
        circuit = backend_state(gw.base_url, "e1")["circuit"]
    refusals = [r for r in caplog.records if "backend e1 of model" in r.getMessage()]
    assert opened == [200] * 8
    assert (still_open, cooled) == ("open", "half_open")
    assert burst == [200] * 8
    assert len(refusals) == 1
    assert circuit == "open"


async def test_successful_half_open_probe_closes_the_circuit() -> None:
    """A backend whose refused connection opened its circuit and has come back meanwhile gets no
    traffic before the cool-down; after it the probe succeeds, the circuit closes, and it
    takes its share again: 5 of the 10 requests that follow (the probe among them), since
    the router (``least_inflight``) makes idle backends take turns."""
    e1 = EngineServer(seed=1)
    e1.start()
    e1.stop()  # down, with a known address to come back on
    try:
        with (
            engine_server() as e0,
            clocked_gateway([e0.port, e1.port], PASSIVE, scrape=False) as (gw, clock),
        ):
            opened = await _statuses(gw, 8)
            e1.start()
            early = await _statuses(gw, 4)
            before_cooldown = e1.stats()["admitted_total"]
            clock.advance(COOLDOWN_S)
            after = await _statuses(gw, 10)
            circuit = backend_state(gw.base_url, "e1")["circuit"]
            served = e1.stats()["admitted_total"]
    finally:
        e1.stop()
    assert opened == [200] * 8
    assert early == [200] * 4
    assert before_cooldown == 0
    assert after == [200] * 10
    assert circuit == "closed"
    assert served == 5


async def test_engine_dying_mid_stream_ends_the_stream_with_an_error_event() -> None:
    """An engine that dies while streaming: the client's stream ends with an OpenAI error
    event and ``data: [DONE]``, the gateway frees the slot (nothing running), and new
    requests go to the other engine."""
    with (
        engine_server() as e0,
        engine_server(seed=1) as e1,
        gateway_at([e0.port, e1.port], ONE_STRIKE) as gateway,
    ):
        async with aiohttp.ClientSession() as session:
            stream = await open_stream(session, gateway.base_url, events=2)
            on_e0 = backend_state(gateway.base_url, "e0")["inflight"] == 1
            reader = asyncio.ensure_future(read_events(stream))
            e0.kill()
            events = await asyncio.wait_for(reader, 2.0)
            stream.close()
        freed = await _until(lambda: model_state(gateway.base_url)["running"] == 0, 1.0)
        statuses = await _statuses(gateway, 6)
        served = e1.stats()["admitted_total"]
    assert on_e0, "the first request should have gone to the first backend"
    assert events[-1] == b"[DONE]"
    error = orjson.loads(events[-2])["error"]
    assert error["code"] == "upstream_error"
    assert freed
    assert statuses == [200] * 6
    assert served == 6


async def test_engine_dying_mid_request_answers_502_and_frees_the_slot() -> None:
    """A non-streamed request whose engine dies before answering gets 502
    ``upstream_unavailable`` with an OpenAI error body, and the gateway frees its slot.

    The emulator sends nothing of a non-streamed answer before all of it, so the killed
    connection fails before any response; the gateway's one retry on a new connection
    finds the port closed: the engine is unreachable, not an answer cut off."""
    with (
        engine_server() as e0,
        engine_server(seed=1) as e1,
        gateway_at([e0.port, e1.port], ONE_STRIKE) as gateway,
    ):
        async with aiohttp.ClientSession() as session:
            reply = asyncio.ensure_future(
                session.post(
                    gateway.base_url + "/v1/completions", json={**SMALL, "max_tokens": 3000}
                )
            )
            running = await _until(
                lambda: backend_state(gateway.base_url, "e0")["inflight"] == 1, 2.0
            )
            e0.kill()
            async with await asyncio.wait_for(reply, 2.0) as response:
                status, body = response.status, await response.json()
        freed = await _until(lambda: model_state(gateway.base_url)["running"] == 0, 1.0)
    assert running, "the first request should have gone to the first backend"
    assert status == 502
    assert body == {
        "error": {
            "message": "the engine is unreachable",
            "type": "api_error",
            "code": "upstream_unavailable",
            "param": None,
        }
    }
    assert freed
