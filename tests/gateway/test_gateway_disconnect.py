"""A client that leaves frees what it held at once: its engine request, its slot, its place
in the queue."""

from __future__ import annotations

import asyncio
import time

import aiohttp
import pytest

from tests.gateway.gateway_harness import (
    MODEL,
    Stack,
    engine_stats,
    model_state,
    open_stream,
    outcomes,
    stack,
    wait_until,
)

ONE_SLOT = """    max_concurrency: 1
    lanes:
      - {name: interactive, max_concurrency: 1, max_queue: 8}
"""
SMALL = {"model": MODEL, "prompt": "queued", "max_tokens": 5, "ignore_eos": True}


def _settles(gateway: Stack, *, running: int, queued: int, within_s: float = 1.0) -> bool:
    """Whether the gateway shows ``running``/``queued`` for the model within ``within_s``."""

    def check() -> bool:
        state = model_state(gateway.base_url)
        return (state["running"], state["queued"]) == (running, queued)

    return wait_until(check, within_s)


async def _settled(gateway: Stack, *, running: int, queued: int) -> bool:
    return await asyncio.to_thread(_settles, gateway, running=running, queued=queued)


async def test_stream_disconnect_aborts_the_engine_request_and_frees_the_slot() -> None:
    """A streaming client that reads two chunks and closes: within 1 s the engine has
    aborted the request and the gateway shows nothing running."""
    with stack(ONE_SLOT) as gateway:
        async with aiohttp.ClientSession() as session:
            stream = await open_stream(session, gateway.base_url, events=2)
            assert model_state(gateway.base_url)["running"] == 1
            stream.close()
            aborted = await asyncio.to_thread(
                wait_until, lambda: engine_stats(gateway.engine_url())["aborted_total"] == 1, 1.0
            )
            freed = await _settled(gateway, running=0, queued=0)
            stats = engine_stats(gateway.engine_url())
    assert aborted
    assert freed
    assert (stats["running"], stats["finished_total"]) == (0, 0)


async def test_stream_disconnect_admits_the_next_queued_request() -> None:
    """With one slot, A streams a long answer and B queues; when A disconnects mid-stream B
    is admitted and completes long before A would have finished."""
    with stack(ONE_SLOT) as gateway:
        async with aiohttp.ClientSession() as session:
            a = await open_stream(session, gateway.base_url, events=2, max_tokens=1500)
            b = asyncio.ensure_future(
                session.post(gateway.base_url + "/v1/completions", json=SMALL)
            )
            assert await _settled(gateway, running=1, queued=1)
            start = time.monotonic()
            a.close()
            async with await b as reply:
                body = await reply.json()
            waited = time.monotonic() - start
    assert reply.status == 200
    assert body["usage"]["completion_tokens"] == 5
    assert waited < 1.0  # A alone had ~1500 steps (≥ 3 s) left


@pytest.mark.parametrize("guarded", [True, False], ids=["gateway-protocol", "plain-uvicorn"])
async def test_queued_client_that_leaves_is_dropped_and_never_reaches_the_engine(
    guarded: bool,
) -> None:
    """With one slot, B queues behind A and then disconnects: the gateway's queue is empty
    again within 1 s, and B is never sent to the engine, not even after A ends. The
    gateway's protocol reports the loss through its ``sluicegate.on_disconnect`` callback;
    under plain uvicorn a task per request watches ``receive`` instead."""
    with stack(ONE_SLOT, guarded=guarded) as gateway:
        async with aiohttp.ClientSession() as session:
            a = await open_stream(session, gateway.base_url)
            admitted = engine_stats(gateway.engine_url())["admitted_total"]
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(
                    session.post(gateway.base_url + "/v1/completions", json=SMALL), 0.3
                )
            dropped = await _settled(gateway, running=1, queued=0)
            a.close()
            idle = await _settled(gateway, running=0, queued=0)
            await asyncio.sleep(0.1)
            after = engine_stats(gateway.engine_url())
    assert dropped
    assert idle
    assert admitted == 1
    assert after["admitted_total"] == admitted


async def test_non_streaming_client_that_gives_up_aborts_its_request() -> None:
    """A non-streamed request whose client times out while it runs is aborted in the
    engine, and its slot is free within 1 s."""
    long = {**SMALL, "max_tokens": 1500}
    with stack(ONE_SLOT) as gateway:
        async with aiohttp.ClientSession() as session:
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(
                    session.post(gateway.base_url + "/v1/completions", json=long), 0.3
                )
            aborted = await asyncio.to_thread(
                wait_until, lambda: engine_stats(gateway.engine_url())["aborted_total"] == 1, 1.0
            )
            freed = await _settled(gateway, running=0, queued=0)
    assert aborted
    assert freed


async def test_every_request_ends_exactly_once_as_what_happened_to_it() -> None:
    """After a stream cut by its client, a queued client that left and one served request,
    ``sluicegate_requests_total`` counts exactly two ``cancelled`` and one ``completed``."""
    with stack(ONE_SLOT) as gateway:
        async with aiohttp.ClientSession() as session:
            a = await open_stream(session, gateway.base_url, events=2)
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(
                    session.post(gateway.base_url + "/v1/completions", json=SMALL), 0.2
                )
            a.close()
            assert await _settled(gateway, running=0, queued=0)
            async with session.post(gateway.base_url + "/v1/completions", json=SMALL) as reply:
                assert reply.status == 200
                await reply.read()
            counted = outcomes(gateway.base_url)
    assert counted == {"cancelled": 2, "completed": 1}
