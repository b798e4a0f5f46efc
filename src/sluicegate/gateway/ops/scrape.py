"""Backend health probes, engine-metrics scrapes and info reads, fed to the scheduler.

What to ask each engine and how to read its answers is its profile's
(``sluicegate.engine_profiles``): the health path (llama-server answers 503 while it
loads: down), the metrics path (or the backend's ``metrics_url``: Triton and Ray Serve
export on a port of their own), the metric names and how they map to running, waiting,
KV usage and KV capacity, and an info document some engines keep their limits in
(TGI's ``/info``, SGLang's ``/get_server_info``), read until it answers well and again
after the engine was seen down.

An engine without ``/health`` answers 404, which still proves it up. Without
``/metrics`` (404, 501 from a llama-server started without ``--metrics``, or a body that
is not Prometheus text) the scheduler keeps its own signals (in-flight counts, passive
health) and the endpoint is asked again only every ``METRICS_RETRY_POLLS`` polls. A
good scrape restarts the backend's staleness clock; one that keeps failing leaves the
backend counted as full once ``metrics_stale_after_s`` passes (``core/backend_state``).
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass

import aiohttp
import orjson

from sluicegate.core.ticket import BackendStats
from sluicegate.engine_profiles import EngineProfile, Reading, profile, scan
from sluicegate.errors import SluicegateError
from sluicegate.gateway.state import GatewayState

PROBE_TIMEOUT = aiohttp.ClientTimeout(total=2.0)
METRICS_RETRY_POLLS = 30
NO_METRICS_STATUSES = frozenset({404, 501})  # 501: llama-server without ``--metrics``
IDENTITY = {"Accept-Encoding": "identity"}
"""Asked of every probe, scrape and info read: the upstream session does not decompress
(it relays bodies as they come), and prometheus-client's exporters — vLLM's, Ray's —
gzip the page for a client that accepts it (aiohttp's default header does)."""
MAX_SCRAPE_BYTES = 8 * 1024 * 1024
"""The most of a metrics page or info document read: a broken engine's endless answer
must not take the gateway's memory."""


def parse_engine_metrics(engine: EngineProfile, text: str) -> Reading:
    """What ``engine``'s profile reads from a Prometheus page; ``ValueError`` if the page is
    not Prometheus text."""
    return engine.read_metrics(scan(text, engine.metric_names))


def stats_from(
    model: str, backend: str, reading: Reading | None, healthy: bool | None = None
) -> BackendStats:
    """What a probe (``healthy``) and a good scrape (``reading``; None: none) tell the
    scheduler about a backend."""
    if reading is None:
        return BackendStats(model=model, backend=backend, healthy=healthy)
    return BackendStats(
        model=model,
        backend=backend,
        healthy=healthy,
        kv_cache_usage=reading.kv_usage,
        num_requests_running=reading.running,
        num_requests_waiting=reading.waiting,
        kv_capacity_tokens=reading.kv_capacity_tokens,
        scraped=True,
    )


async def probe(session: aiohttp.ClientSession, url: str, engine: EngineProfile) -> bool:
    """Whether the engine at ``url`` is up: its health path answers as its profile says."""
    try:
        path = url + (engine.health_path or "/")
        async with session.get(path, timeout=PROBE_TIMEOUT, headers=IDENTITY) as r:
            return engine.healthy(r.status)
    except (TimeoutError, aiohttp.ClientError):
        return False


class _NoMetricsError(SluicegateError):
    """The engine has no usable metrics page."""


async def _fetch(session: aiohttp.ClientSession, url: str) -> tuple[int, bytes] | None:
    """Status and body (at most ``MAX_SCRAPE_BYTES``) of a GET; None if it failed."""
    try:
        async with session.get(url, timeout=PROBE_TIMEOUT, headers=IDENTITY) as response:
            parts, size = [], 0
            async for part in response.content.iter_chunked(64 * 1024):
                size += len(part)
                if size > MAX_SCRAPE_BYTES:
                    return None
                parts.append(part)
            return response.status, b"".join(parts)
    except (TimeoutError, aiohttp.ClientError):
        return None


@dataclass
class _Target:
    model: str
    backend: str
    url: str
    metrics_url: str | None
    engine: EngineProfile
    skip_metrics: int = 0  # polls left before the metrics page is asked for again
    info: Reading | None = None  # the info document's reading, once read


class Poller:
    """Probes, scrapes and reads the info of every configured backend, remembering which
    lack metrics."""

    def __init__(self, state: GatewayState) -> None:
        self._state = state
        self._targets = []
        for model in state.config.models:
            for backend in model.backends:
                engine = profile(backend.engine)
                url = state.backend_url(model.name, backend.name)
                path = engine.metrics_path
                metrics = backend.metrics_url or (None if path is None else url + path)
                self._targets.append(_Target(model.name, backend.name, url, metrics, engine))

    async def poll_once(self) -> None:
        """Probe and scrape every backend once, concurrently, and tell the scheduler."""
        session = self._state.upstream.session
        targets = self._targets
        probes = await asyncio.gather(*(probe(session, t.url, t.engine) for t in targets))
        readings = await asyncio.gather(
            *(self._read(session, t, up) for t, up in zip(targets, probes, strict=True))
        )
        for target, healthy, reading in zip(targets, probes, readings, strict=True):
            stats = stats_from(target.model, target.backend, reading, healthy)
            self._state.driver.observe(stats)

    async def _read(
        self, session: aiohttp.ClientSession, target: _Target, up: bool
    ) -> Reading | None:
        """The target's metrics merged with its info; None if the scrape failed."""
        if not up:
            target.info = None  # a restarted engine may come back with other limits
            return None
        if target.engine.info_path is not None and target.info is None:
            target.info = await _info(session, target)
        reading = await self._metrics(session, target)
        if reading is None:
            return None
        return reading.merged(target.info) if target.info is not None else reading

    async def _metrics(self, session: aiohttp.ClientSession, target: _Target) -> Reading | None:
        if target.metrics_url is None:
            return None
        if target.skip_metrics > 0:
            target.skip_metrics -= 1
            return None
        try:
            return await _scrape(session, target.metrics_url, target.engine)
        except _NoMetricsError:
            target.skip_metrics = METRICS_RETRY_POLLS
            return None


async def _scrape(
    session: aiohttp.ClientSession, url: str, engine: EngineProfile
) -> Reading | None:
    """The engine's reading; None on a failed scrape; ``_NoMetricsError`` if it has none."""
    answer = await _fetch(session, url)
    if answer is None:
        return None
    status, body = answer
    if status in NO_METRICS_STATUSES:
        raise _NoMetricsError
    if status != 200:
        return None
    try:
        return parse_engine_metrics(engine, body.decode("utf-8", "replace"))
    except ValueError as exc:
        raise _NoMetricsError from exc


async def _info(session: aiohttp.ClientSession, target: _Target) -> Reading | None:
    """The reading of the target's info document; None until it answers a JSON object."""
    assert target.engine.info_path is not None
    answer = await _fetch(session, target.url + target.engine.info_path)
    if answer is None or answer[0] != 200:
        return None
    try:
        document = orjson.loads(answer[1])
    except orjson.JSONDecodeError:
        return None
    return target.engine.read_info(document) if isinstance(document, dict) else None


async def poll_forever(state: GatewayState) -> None:
    """Poll at the configured interval until cancelled."""
    poller = Poller(state)
    interval = state.config.server.scrape_interval_s
    while True:
        with contextlib.suppress(aiohttp.ClientError, asyncio.TimeoutError):
            await poller.poll_once()
        await asyncio.sleep(interval)
