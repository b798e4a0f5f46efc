"""A client that leaves must free llama.cpp at once: the engine serves one request at a
time, and only notices that its caller is gone when the gateway closes the upstream
connection of a stream."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import aiohttp
import pytest

from tests.gateway.gateway_harness import Stack, model_state, wait_until
from tests.realengine.llama_server import LlamaServer, require_llama_cpp
from tests.realengine.realengine_client import (
    completion_body,
    engine_answers_within,
    stalled_stream,
    wait_engine_idle,
)
from tests.realengine.realengine_stack import GatewayFactory, held_with_a_waiter, hold_engine

require_llama_cpp()
pytestmark = pytest.mark.realengine

FREED_WITHIN_S = 1.0
# ~3 s of engine time unloaded (generation slows as the context fills: 500 tokens take
# ~0.6 s, 1000 ~3 s, 2000 ~10 s).
LONG_UNARY_TOKENS = 1000


@pytest.fixture
def gateway(gateway_for: GatewayFactory) -> Iterator[Stack]:
    """A gateway in front of the engine, no scraping."""
    with gateway_for(scrape=False) as stack:
        yield stack


async def test_stream_disconnect_lets_the_next_request_run_within_a_second(
    gateway: Stack,
) -> None:
    """A streaming client leaves mid-stream while another request waits in the gateway: the
    waiting request is answered within a second, long before the stream would have ended."""
    async with held_with_a_waiter(gateway, "next", 8) as (holder, waiting):
        assert await asyncio.to_thread(
            wait_until, lambda: model_state(gateway.base_url)["queued"] == 1, 5.0
        )
        left = time.monotonic()
        holder.close()
        answer = await asyncio.wait_for(waiting, 30)
        took = time.monotonic() - left
    assert answer.choices[0].finish_reason == "length"
    assert took < FREED_WITHIN_S, f"the next request waited {took:.2f} s"


async def test_stream_disconnect_frees_the_engine_itself(
    llama_engine: LlamaServer, gateway: Stack
) -> None:
    """The engine, asked directly, is idle again within a second of the client leaving."""
    async with aiohttp.ClientSession() as session:
        holder = await hold_engine(session, gateway)
        busy = not await asyncio.to_thread(engine_answers_within, llama_engine.url, 0.3)
        holder.close()
        idle_after = await asyncio.to_thread(wait_engine_idle, llama_engine.url, 10.0)
    assert busy
    assert idle_after is not None
    assert idle_after < FREED_WITHIN_S, f"the engine stayed busy {idle_after:.2f} s"


async def test_unary_disconnect_frees_the_engine_within_a_second(
    llama_engine: LlamaServer, gateway: Stack
) -> None:
    """A client of a long non-streamed request leaves: the engine is idle within a second."""
    async with aiohttp.ClientSession() as session:
        request = asyncio.ensure_future(
            session.post(
                gateway.base_url + "/v1/completions",
                json=completion_body("long unary", LONG_UNARY_TOKENS),
            )
        )
        assert await asyncio.to_thread(
            wait_until, lambda: model_state(gateway.base_url)["running"] == 1, 2.0
        )
        await asyncio.sleep(0.3)
        request.cancel()
        idle_after = await asyncio.to_thread(
            wait_engine_idle, llama_engine.url, FREED_WITHIN_S + 0.5
        )
    assert idle_after is not None
    assert idle_after < FREED_WITHIN_S, f"the engine stayed busy {idle_after:.2f} s"


async def test_stalled_client_is_cut_off_and_the_engine_freed(
    llama_engine: LlamaServer, gateway_for: GatewayFactory
) -> None:
    """A client that stops reading without closing (its answer far larger than the socket
    buffers between it and the engine) is cut off after the gateway's send timeout, which
    frees the engine."""
    with gateway_for("server: {client_stall_timeout_s: 1.0}\n", scrape=False) as gateway:
        sock = stalled_stream(gateway.gateway_port)
        try:
            assert await asyncio.to_thread(
                wait_until, lambda: model_state(gateway.base_url)["running"] == 1, 2.0
            )
            idle_after = await asyncio.to_thread(wait_engine_idle, llama_engine.url, 8.0)
        finally:
            sock.close()
    assert idle_after is not None, "the engine stayed busy behind the stalled client"
