"""Health and scraping against an engine that has neither ``/health`` nor ``/metrics``: the
gateway keeps the backend healthy on its own signals, never probes a route that waits on
generation, stops asking for metrics that are not there, and takes an engine back after a
restart."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import aiohttp
import pytest

from tests.gateway.gateway_harness import MODEL, backend_state, metric, wait_until
from tests.realengine.llama_server import LlamaServer, llama_server, require_llama_cpp
from tests.realengine.realengine_client import completion_body
from tests.realengine.realengine_stack import GatewayFactory, gateway_on

require_llama_cpp()
pytestmark = pytest.mark.realengine

INTERVAL_S = 0.1
FAST_POLLS = f"server: {{scrape_interval_s: {INTERVAL_S}}}\n"


def _healthy(base_url: str) -> bool:
    return bool(backend_state(base_url, "llama")["healthy"])


def test_engine_without_health_or_metrics_stays_healthy_with_no_engine_metrics(
    gateway_for: GatewayFactory,
) -> None:
    """After many polls the backend is healthy, its circuit closed, and nothing the engine
    does not report (KV usage, its queue) is made up."""
    with gateway_for(FAST_POLLS) as gateway:
        time.sleep(10 * INTERVAL_S)
        state = backend_state(gateway.base_url, "llama")
        healthy = metric(gateway.base_url, "sluicegate_backend_healthy", model=MODEL)
        kv = metric(gateway.base_url, "sluicegate_backend_kv_cache_usage", model=MODEL)
    assert (state["healthy"], state["circuit"]) == (True, "closed")
    assert (state["kv_cache_usage"], state["num_requests_waiting"]) == (None, None)
    assert healthy == 1.0
    assert kv is None


def test_an_engine_without_metrics_is_never_asked_for_them(
    llama_engine: LlamaServer, gateway_for: GatewayFactory
) -> None:
    """llama-cpp-python has no ``/metrics``, and its profile says so: over twenty polls the
    engine never sees ``GET /metrics``, and sees ``GET /health`` at every poll."""
    metrics_before = llama_engine.requests_logged("GET /metrics")
    health_before = llama_engine.requests_logged("GET /health")
    with gateway_for(FAST_POLLS):
        time.sleep(20 * INTERVAL_S)
    metrics_asked = llama_engine.requests_logged("GET /metrics") - metrics_before
    health_asked = llama_engine.requests_logged("GET /health") - health_before
    assert metrics_asked == 0
    assert health_asked >= 10


async def test_probes_never_wait_on_the_request_being_generated(
    llama_engine: LlamaServer, gateway_for: GatewayFactory
) -> None:
    """While the engine generates (a stream sent to it directly), the backend stays healthy
    at every poll: the probe does not queue behind generation."""
    with gateway_for(FAST_POLLS) as gateway:
        async with aiohttp.ClientSession() as session:
            body = completion_body("keep busy", 3000, stream=True)
            async with session.post(llama_engine.url + "/v1/completions", json=body) as stream:
                assert (await stream.content.readline()).startswith(b"data:")
                samples = []
                for _ in range(15):
                    samples.append(await asyncio.to_thread(_healthy, gateway.base_url))
                    await asyncio.sleep(INTERVAL_S)
    assert all(samples), samples


def test_an_engine_that_restarts_is_taken_back(tiny_model: Path) -> None:
    """Stopped, the engine is marked down within a second; started again on the same port,
    it is marked up within a second, though it has no ``/health``."""
    log = tiny_model.with_name("restart.log")
    with llama_server(tiny_model, log) as engine, gateway_on(engine.port, FAST_POLLS) as gateway:
        assert wait_until(lambda: _healthy(gateway.base_url), 1.0)
        engine.stop()
        down = wait_until(lambda: not _healthy(gateway.base_url), 1.0)
        engine.start()
        up = wait_until(lambda: _healthy(gateway.base_url), 1.0)
    assert down
    assert up
