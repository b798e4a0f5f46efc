"""Backend health probes and engine-metrics scraping, fed to the scheduler.

Understands vLLM (``vllm:kv_cache_usage_perc``, the older
``vllm:gpu_cache_usage_perc``, ``vllm:num_requests_running/waiting``), SGLang
(``sglang:token_usage``, ``sglang:num_running_reqs``, ``sglang:num_queue_reqs``)
and llama.cpp's own server, ``llama-server --metrics``
(``llamacpp:requests_processing``: busy slots; ``llamacpp:requests_deferred``:
requests waiting in its own queue for a slot). llama-server exports no KV-cache
gauge since its KV-cache rewrite (0.3.36 has none; older builds had
``llamacpp:kv_cache_usage_ratio``, still read when present), and a slot holds
its context until the request ends, so busy slots are not KV pressure: a
``kv_cache`` adaptive limit has nothing to follow there, and the cap that keeps its
queue empty is ``max_concurrency`` = ``--parallel``. vLLM's
``vllm:cache_config_info`` (labels ``num_gpu_blocks`` × ``block_size``) gives the
KV capacity in tokens that an ``auto`` in-flight token budget is derived from.

Not every engine has both endpoints; llama-cpp-python has neither. Without
``/health``, any HTTP answer to the probe (a 404 included) means the engine is
up, so a backend marked down while unreachable is taken back once it answers
again (llama-server answers 503 while it loads its model: down). Without
``/metrics`` (404, 501 from a llama-server started without ``--metrics``, or a
body that is not Prometheus text), the scheduler keeps its own signals (in-flight
counts, passive health) and the endpoint is asked again only every
``METRICS_RETRY_POLLS`` polls. Probes use only those two paths: on
llama-cpp-python any other route may wait behind the request being generated,
or interrupt it.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
from dataclasses import dataclass

import aiohttp

from sluicegate.core.ticket import BackendStats
from sluicegate.errors import SluicegateError
from sluicegate.gateway.state import GatewayState

KV_USAGE = (
    "vllm:kv_cache_usage_perc",
    "vllm:gpu_cache_usage_perc",
    "sglang:token_usage",
    "llamacpp:kv_cache_usage_ratio",
)
RUNNING = ("vllm:num_requests_running", "sglang:num_running_reqs", "llamacpp:requests_processing")
WAITING = ("vllm:num_requests_waiting", "sglang:num_queue_reqs", "llamacpp:requests_deferred")
CACHE_CONFIG = "vllm:cache_config_info"
KV_CAPACITY = "kv_capacity_tokens"  # key of the derived capacity in ``parse_engine_metrics``
PROBE_TIMEOUT = aiohttp.ClientTimeout(total=2.0)
METRICS_RETRY_POLLS = 30
NO_METRICS_STATUSES = frozenset({404, 501})  # 501: llama-server without ``--metrics``
_WANTED = frozenset(KV_USAGE + RUNNING + WAITING)
_SAMPLE_HEAD = re.compile(r"[ \t]*([a-zA-Z_:][a-zA-Z0-9_:]*)[ \t]*")
_LABEL_BLOCK = re.compile(r'\{(?:[^"}]|"(?:[^"\\]|\\.)*")*\}')
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"')


def parse_engine_metrics(text: str) -> dict[str, float]:
    """Sum the samples of the known engine metrics (over labels such as ``model_name``).

    The KV capacity from ``vllm:cache_config_info``, when its labels give it, is
    under ``KV_CAPACITY``. A line that is not a sample is skipped; ``ValueError`` if
    no line is (a body that is not Prometheus text). A scan with two regular
    expressions that parses labels only where it needs them: prometheus-client's full
    parser cost ~2% of the gateway's CPU at 200 req/s, scraping once a second.
    """
    found: dict[str, float] = {}
    samples = skipped = 0
    for line in text.splitlines():
        sample = _sample(line)
        if sample is None:
            stripped = line.strip()
            skipped += bool(stripped) and not stripped.startswith("#")
            continue
        samples += 1
        name, labels, value = sample
        if name in _WANTED:
            found[name] = found.get(name, 0.0) + value
        elif name == CACHE_CONFIG:
            capacity = _kv_capacity(dict(_LABEL.findall(labels)))
            if capacity is not None:
                found[KV_CAPACITY] = float(capacity)
    if samples == 0 and skipped:
        raise ValueError("not Prometheus text")
    return found


def _sample(line: str) -> tuple[str, str, float] | None:
    """``(name, label text, value)`` of a sample line (exemplar and timestamp dropped),
    ``None`` for anything else."""
    head = _SAMPLE_HEAD.match(line)
    if head is None:
        return None
    rest, labels = line[head.end() :], ""
    if rest.startswith("{"):
        block = _LABEL_BLOCK.match(rest)
        if block is None:
            return None
        labels, rest = rest[1 : block.end() - 1], rest[block.end() :]
    fields = rest.split()
    if "#" in fields:  # an OpenMetrics exemplar follows
        fields = fields[: fields.index("#")]
    if not 1 <= len(fields) <= 2:
        return None
    try:
        return head.group(1), labels, float(fields[0])
    except ValueError:
        return None


def _kv_capacity(labels: dict[str, str]) -> int | None:
    """``num_gpu_blocks × block_size``; None if either is missing or not a positive
    integer (vLLM reports ``num_gpu_blocks="None"`` before profiling the GPU)."""
    try:
        blocks, size = int(labels["num_gpu_blocks"]), int(labels["block_size"])
    except (KeyError, ValueError):
        return None
    return blocks * size if blocks > 0 and size > 0 else None


def _first(found: dict[str, float], names: tuple[str, ...]) -> float | None:
    return next((found[name] for name in names if name in found), None)


def stats_from(
    model: str, backend: str, found: dict[str, float], healthy: bool | None = None
) -> BackendStats:
    """What a probe (``healthy``) and a scrape (``found``) tell the scheduler about a backend."""
    running, waiting = _first(found, RUNNING), _first(found, WAITING)
    capacity = found.get(KV_CAPACITY)
    return BackendStats(
        model=model,
        backend=backend,
        healthy=healthy,
        kv_cache_usage=_first(found, KV_USAGE),
        num_requests_running=None if running is None else int(running),
        num_requests_waiting=None if waiting is None else int(waiting),
        kv_capacity_tokens=None if capacity is None else int(capacity),
    )


async def probe(session: aiohttp.ClientSession, url: str) -> bool:
    """Whether the engine at ``url`` is up: ``GET /health`` answers below 500.

    An engine without ``/health`` answers 404, which still proves it is up.
    """
    try:
        async with session.get(url + "/health", timeout=PROBE_TIMEOUT) as response:
            return response.status < 500
    except (TimeoutError, aiohttp.ClientError):
        return False


class _NoMetricsError(SluicegateError):
    """The engine has no usable ``/metrics``."""


async def _scrape(session: aiohttp.ClientSession, url: str) -> dict[str, float] | None:
    """The engine's known metrics; None on a failed scrape; ``_NoMetricsError`` if it has none."""
    try:
        async with session.get(url + "/metrics", timeout=PROBE_TIMEOUT) as response:
            if response.status in NO_METRICS_STATUSES:
                raise _NoMetricsError
            if response.status != 200:
                return None
            text = await response.text()
    except (TimeoutError, aiohttp.ClientError):
        return None
    try:
        return parse_engine_metrics(text)
    except ValueError as exc:
        raise _NoMetricsError from exc


@dataclass
class _Target:
    model: str
    backend: str
    url: str
    skip_metrics: int = 0  # polls left before /metrics is asked for again


class Poller:
    """Probes and scrapes every configured backend, remembering which lack ``/metrics``."""

    def __init__(self, state: GatewayState) -> None:
        self._state = state
        self._targets = [
            _Target(model.name, backend.name, state.backend_url(model.name, backend.name))
            for model in state.config.models
            for backend in model.backends
        ]

    async def poll_once(self) -> None:
        """Probe and scrape every backend once, concurrently, and tell the scheduler."""
        session = self._state.upstream.session
        probes = await asyncio.gather(*(probe(session, t.url) for t in self._targets))
        scrapes = await asyncio.gather(*(self._metrics(session, t) for t in self._targets))
        for target, healthy, found in zip(self._targets, probes, scrapes, strict=True):
            stats = stats_from(target.model, target.backend, found or {}, healthy)
            self._state.driver.observe(stats)

    async def _metrics(
        self, session: aiohttp.ClientSession, target: _Target
    ) -> dict[str, float] | None:
        if target.skip_metrics > 0:
            target.skip_metrics -= 1
            return None
        try:
            return await _scrape(session, target.url)
        except _NoMetricsError:
            target.skip_metrics = METRICS_RETRY_POLLS
            return None


async def poll_forever(state: GatewayState) -> None:
    """Poll at the configured interval until cancelled."""
    poller = Poller(state)
    interval = state.config.server.scrape_interval_s
    while True:
        with contextlib.suppress(aiohttp.ClientError, asyncio.TimeoutError):
            await poller.poll_once()
        await asyncio.sleep(interval)
