"""The gateway scrapes llama-server's ``llamacpp:*`` metrics and routes on them.

llama-server (0.3.36) exports ``llamacpp:requests_processing`` (busy slots) and
``llamacpp:requests_deferred`` (its own wait queue) but no KV-cache gauge, so the
gateway's view of a backend gets ``num_requests_waiting`` from it and no
``kv_cache_usage``; ``least_expected_time`` counts the engine's queue. The load that
fills the engine's queue is sent to the engine directly, past the gateway, as another
client sharing the engine would.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest

from tests.gateway.gateway_harness import (
    ADMIN_KEY,
    MODEL,
    Stack,
    admin_state,
    http_call,
    wait_until,
)
from tests.realengine.llama_cpp_server import (
    LlamaCppServer,
    llama_cpp_server,
    llama_server_gateway,
)
from tests.realengine.realengine_stack import GatewayFactory

pytestmark = pytest.mark.realengine

SLOTS = 4
# Direct streams: 4 run and 12 wait in the engine's queue, which lasts three rounds of
# HOLD_TOKENS (~3 s a round on an idle machine with one thread: one round is too short for
# the gateway's scrapes and the routed requests to happen inside it on a busy one).
OVERLOAD = 16
HOLD_TOKENS = 1800
SHORT_TOKENS = 16
ROUTED = 8
FAST_SCRAPE = "server:\n  scrape_interval_s: 0.1\n"
LEAST_EXPECTED_TIME = "    router: least_expected_time\n" + FAST_SCRAPE
PREDICTED = "llamacpp:tokens_predicted_total"


@asynccontextmanager
async def _engine_overloaded(engine: LlamaCppServer) -> AsyncIterator[None]:
    """``OVERLOAD`` long streams sent to the engine directly, held until exit: its 4 slots
    busy and the rest deferred in its own queue."""
    body = {
        "model": MODEL, "prompt": "direct load", "max_tokens": HOLD_TOKENS,
        "ignore_eos": True, "stream": True,
    }  # fmt: skip
    async with aiohttp.ClientSession() as session:
        streams = [
            asyncio.ensure_future(session.post(engine.url + "/v1/completions", json=body))
            for _ in range(OVERLOAD)
        ]
        try:
            # Its 4 slots busy and a queue of its own. How many of the other 4 are deferred
            # at a given moment varies (its HTTP threads take them in one by one), so the
            # tests compare with what the engine reports, not with a fixed count.
            queued = await asyncio.to_thread(
                wait_until,
                lambda: _busy_and_queued(engine.metrics()),
                10.0,
            )
            assert queued, engine.metrics()
            yield
        finally:
            for stream in streams:
                stream.cancel()
            for response in await asyncio.gather(*streams, return_exceptions=True):
                if isinstance(response, aiohttp.ClientResponse):
                    response.close()
            await asyncio.to_thread(engine.wait_idle, 30.0)


def _busy_and_queued(metrics: dict[str, float]) -> bool:
    return (
        metrics["llamacpp:requests_processing"] == SLOTS
        and metrics["llamacpp:requests_deferred"] >= 1
    )


def _backends(gateway: Stack) -> dict[str, dict[str, Any]]:
    """The gateway's view of each backend (``/admin/state``), by name."""
    model = admin_state(gateway.base_url)["models"][0]
    return {backend["name"]: backend for backend in model["backends"]}


def _waiting_seen(gateway: Stack, backend: str, count: int) -> bool:
    return wait_until(lambda: _backends(gateway)[backend]["num_requests_waiting"] == count, 5.0)


def _engine_queue_seen(gateway: Stack, engine: LlamaCppServer) -> bool:
    """Whether the gateway's view of ``llama-0`` shows the engine's own queue (as reported
    by the engine at that moment, at least 1) within 5 s."""

    def agree() -> bool:
        waiting = _backends(gateway)["llama-0"]["num_requests_waiting"]
        deferred = engine.metrics()["llamacpp:requests_deferred"]
        return waiting is not None and waiting >= 1 and waiting == deferred

    return wait_until(agree, 5.0)


def _gateway_metrics(gateway: Stack) -> str:
    reply = http_call(gateway.base_url, "GET", "/metrics", key=ADMIN_KEY)
    assert reply.status == 200, reply
    return reply.body.decode()


async def test_the_gateway_sees_the_engines_own_queue(
    llama_cpp: LlamaCppServer, gateway_for_llama_cpp: GatewayFactory
) -> None:
    """While requests wait in the engine's own queue, the gateway's view of the backend
    shows ``num_requests_waiting`` equal to the engine's ``llamacpp:requests_deferred`` (at
    least 1) within a few scrapes, and 0 again once they are gone;
    ``kv_cache_usage`` stays unknown (this llama-server exports no KV gauge), so no
    ``sluicegate_backend_kv_cache_usage`` sample exists for it."""
    with gateway_for_llama_cpp(FAST_SCRAPE) as gateway:
        assert _waiting_seen(gateway, "llama-0", 0)
        async with _engine_overloaded(llama_cpp):
            seen_queue = await asyncio.to_thread(_engine_queue_seen, gateway, llama_cpp)
            loaded = _backends(gateway)["llama-0"]
        seen_empty = await asyncio.to_thread(_waiting_seen, gateway, "llama-0", 0)
        exported = _gateway_metrics(gateway)
    assert seen_queue, loaded
    assert seen_empty
    assert loaded["kv_cache_usage"] is None
    assert loaded["healthy"] is True
    assert "sluicegate_backend_kv_cache_usage{" not in exported


async def _short_requests(gateway: Stack, count: int) -> None:
    """``count`` short completions one after another, each answered in full."""
    async with openai.AsyncOpenAI(
        base_url=gateway.base_url + "/v1", api_key="unused", max_retries=0, timeout=60
    ) as sdk:
        for i in range(count):
            answer = await sdk.completions.create(
                model=MODEL, prompt=f"routed {i}", max_tokens=SHORT_TOKENS, temperature=0.0
            )
            assert answer.usage is not None
            assert answer.usage.completion_tokens == SHORT_TOKENS


async def test_least_expected_time_routes_around_the_engine_with_a_queue(
    llama_cpp: LlamaCppServer, gateway_for_llama_cpp: GatewayFactory, tmp_path: Path
) -> None:
    """Two llama-servers behind ``least_expected_time``; the first (``llama-0``, which a tie
    would reach half the time) has requests in its own queue from another client. Once the
    gateway has scraped that, 8 requests in a row all go to ``llama-1`` (its
    ``tokens_predicted_total`` grows by exactly 8 x 16), none behind that queue.
    With the queue gone, the same 8 alternate between the two idle backends (4 each)."""
    log = tmp_path / "llama-1.log"
    with llama_cpp_server(llama_cpp.model, parallel=SLOTS, ctx=llama_cpp.ctx, log=log) as second:
        ports = [llama_cpp.port, second.port]
        with llama_server_gateway(ports, LEAST_EXPECTED_TIME) as gateway:
            async with _engine_overloaded(llama_cpp):
                assert await asyncio.to_thread(_engine_queue_seen, gateway, llama_cpp)
                before = second.metrics()[PREDICTED]
                await _short_requests(gateway, ROUTED)
                routed_around = second.metrics()[PREDICTED] - before
            assert await asyncio.to_thread(_waiting_seen, gateway, "llama-0", 0)
            before = second.metrics()[PREDICTED]
            await _short_requests(gateway, ROUTED)
            shared = second.metrics()[PREDICTED] - before
    assert routed_around == ROUTED * SHORT_TOKENS
    assert shared == ROUTED * SHORT_TOKENS // 2
