"""Backend health probes and engine-metrics scraping, fed to the scheduler.

Understands vLLM (``vllm:kv_cache_usage_perc``, the older
``vllm:gpu_cache_usage_perc``, ``vllm:num_requests_running/waiting``), SGLang
(``sglang:token_usage``, ``sglang:num_running_reqs``, ``sglang:num_queue_reqs``)
and llama.cpp (``llamacpp:kv_cache_usage_ratio``, ``llamacpp:requests_processing``,
``llamacpp:requests_deferred``). An engine without ``/metrics`` or ``/health``
is left to the gateway's own signals (passive health, own in-flight counts).
"""

from __future__ import annotations

import asyncio
import contextlib

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from sluicegate.core.ticket import BackendStats
from sluicegate.gateway.state import GatewayState

KV_USAGE = (
    "vllm:kv_cache_usage_perc",
    "vllm:gpu_cache_usage_perc",
    "sglang:token_usage",
    "llamacpp:kv_cache_usage_ratio",
)
RUNNING = ("vllm:num_requests_running", "sglang:num_running_reqs", "llamacpp:requests_processing")
WAITING = ("vllm:num_requests_waiting", "sglang:num_queue_reqs", "llamacpp:requests_deferred")
PROBE_TIMEOUT = aiohttp.ClientTimeout(total=2.0)


def parse_engine_metrics(text: str) -> dict[str, float]:
    """Sum the samples of the known engine metrics (over labels such as ``model_name``)."""
    wanted = set(KV_USAGE + RUNNING + WAITING)
    found: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in wanted:
                found[sample.name] = found.get(sample.name, 0.0) + float(sample.value)
    return found


def _first(found: dict[str, float], names: tuple[str, ...]) -> float | None:
    return next((found[name] for name in names if name in found), None)


def stats_from(model: str, backend: str, found: dict[str, float]) -> BackendStats:
    """What a scrape tells the scheduler about one backend."""
    running, waiting = _first(found, RUNNING), _first(found, WAITING)
    return BackendStats(
        model=model,
        backend=backend,
        kv_cache_usage=_first(found, KV_USAGE),
        num_requests_running=None if running is None else int(running),
        num_requests_waiting=None if waiting is None else int(waiting),
    )


async def _probe(session: aiohttp.ClientSession, url: str) -> bool | None:
    """True/False from ``/health``; None when the engine has no such endpoint."""
    try:
        async with session.get(url + "/health", timeout=PROBE_TIMEOUT) as response:
            if response.status == 404:
                return None
            return response.status < 500
    except (TimeoutError, aiohttp.ClientError):
        return False


async def _scrape(session: aiohttp.ClientSession, url: str) -> dict[str, float] | None:
    try:
        async with session.get(url + "/metrics", timeout=PROBE_TIMEOUT) as response:
            if response.status != 200:
                return None
            return parse_engine_metrics(await response.text())
    except (TimeoutError, aiohttp.ClientError, ValueError):
        return None


async def poll_once(state: GatewayState) -> None:
    """Probe and scrape every backend once, concurrently."""
    session = state.upstream.session
    targets = [
        (model.name, backend.name, state.backend_url(model.name, backend.name))
        for model in state.config.models
        for backend in model.backends
    ]
    probes = await asyncio.gather(*(_probe(session, url) for _, _, url in targets))
    scrapes = await asyncio.gather(*(_scrape(session, url) for _, _, url in targets))
    for (model, backend, _), healthy, found in zip(targets, probes, scrapes, strict=True):
        stats = stats_from(model, backend, found or {})
        if healthy is not None:
            stats = BackendStats(
                model,
                backend,
                healthy,
                stats.kv_cache_usage,
                stats.num_requests_running,
                stats.num_requests_waiting,
            )
        state.driver.observe(stats)


async def poll_forever(state: GatewayState) -> None:
    """Poll at the configured interval until cancelled."""
    interval = state.config.server.scrape_interval_s
    while True:
        with contextlib.suppress(aiohttp.ClientError, asyncio.TimeoutError):
            await poll_once(state)
        await asyncio.sleep(interval)
