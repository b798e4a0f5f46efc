"""The client side of the distributed tests: requests spread over the gateways, and samplers.

Every request is a non-streamed chat completion with ``ignore_eos``, so it
generates exactly ``max_tokens`` tokens; on the ``independent`` engine preset
that takes ``max_tokens`` × 10 ms, whatever else runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import math
import time
from collections.abc import AsyncIterator, Coroutine, Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson

from tests.distributed.cluster import ADMIN_KEY, Cluster, tenant_key

# The prompt every test sends: short, and the same for every tenant, so that
# per-request token charges differ only by ``max_tokens``.
PROMPT = "Tell me about admission control."


@dataclass(frozen=True)
class Reply:
    """One request's outcome, as the client saw it.

    Attributes:
        gateway: index of the gateway it was sent to.
        tenant: the tenant whose key it carried (``None``: no key).
        status: HTTP status, or 0 when the connection failed or the client timed out.
        headers: response headers, names in lower case.
        started_s: ``time.monotonic()`` when it was sent.
        latency_s: until the whole body was read (or the failure).
        error_code: the error body's ``code`` (or the exception's name for status 0).
        prompt_tokens: from the answer's ``usage``.
        completion_tokens: from the answer's ``usage``.
    """

    gateway: int
    tenant: str | None
    status: int
    headers: dict[str, str]
    started_s: float
    latency_s: float
    error_code: str | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0

    @property
    def queue_ms(self) -> float | None:
        """The gateway's ``X-Sluicegate-Queue-Ms``: arrival to admission (answers only)."""
        value = self.headers.get("x-sluicegate-queue-ms")
        return None if value is None else float(value)

    @property
    def admitted_s(self) -> float | None:
        """When the gateway admitted it, on the client's clock: send time + queue time
        (early by the request's transit to the gateway: milliseconds, more in a burst)."""
        queue_ms = self.queue_ms
        return None if queue_ms is None else self.started_s + queue_ms / 1000

    @property
    def vtc_tokens(self) -> int:
        """What VTC charges for it: prompt + 2 × completion tokens."""
        return self.prompt_tokens + 2 * self.completion_tokens


def percentile(values: Sequence[float], q: float) -> float:
    """The nearest-rank ``q``-quantile (0 < q ≤ 1) of ``values``."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def quiet_moment(times: list[float], low: float, high: float) -> float:
    """The middle of the widest gap between consecutive ``times`` within [low, high].

    Admissions come in clusters (a fill grants several slots at once); a window
    endpoint in a gap cannot split a cluster, whose order the client sees only to
    within a few milliseconds.
    """
    inside = sorted(t for t in times if low <= t <= high)
    gaps = [(b - a, (a + b) / 2) for a, b in itertools.pairwise([low, *inside, high])]
    return max(gaps)[1]


def _reply_fields(status: int, data: bytes) -> dict[str, Any]:
    try:
        body = orjson.loads(data)
    except orjson.JSONDecodeError:
        return {"error_code": "unparseable_body"}
    if status == 200:
        usage = body.get("usage") or {}
        return {
            "prompt_tokens": int(usage.get("prompt_tokens", 0)),
            "completion_tokens": int(usage.get("completion_tokens", 0)),
        }
    error = body.get("error") if isinstance(body, dict) else None
    return {"error_code": error.get("code") if isinstance(error, dict) else None}


@dataclass
class Client:
    """Sends requests to a cluster's gateways over one aiohttp session (no connection cap)."""

    cluster: Cluster
    model: str
    session: aiohttp.ClientSession
    timeout_s: float = 30.0
    background: list[asyncio.Task[None]] = field(default_factory=list)

    def spawn(self, work: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        """Run ``work`` in the background until done or until the client closes."""
        task = asyncio.create_task(work)
        self.background.append(task)
        return task

    async def send(
        self,
        gateway: int,
        *,
        tenant: str | None = None,
        max_tokens: int = 1,
        prompt: str = PROMPT,
    ) -> Reply:
        """One chat completion through gateway ``gateway``."""
        body = {
            "model": self.model,
            "messages": [{"role": "user", "content": prompt}],
            "max_tokens": max_tokens,
            "ignore_eos": True,
        }
        headers = {"Authorization": f"Bearer {tenant_key(tenant)}"} if tenant else {}
        url = self.cluster.gateway_url(gateway) + "/v1/chat/completions"
        started = time.monotonic()
        try:
            async with self.session.post(
                url,
                data=orjson.dumps(body),
                headers={"Content-Type": "application/json", **headers},
                timeout=aiohttp.ClientTimeout(total=self.timeout_s),
            ) as response:
                data = await response.read()
                status = response.status
                got = {k.lower(): v for k, v in response.headers.items()}
        except (aiohttp.ClientError, TimeoutError) as exc:
            elapsed = time.monotonic() - started
            return Reply(gateway, tenant, 0, {}, started, elapsed, type(exc).__name__)
        elapsed = time.monotonic() - started
        return Reply(gateway, tenant, status, got, started, elapsed, **_reply_fields(status, data))

    async def burst(
        self,
        n: int,
        *,
        gateways: Sequence[int] | None = None,
        tenant: str | None = None,
        max_tokens: Sequence[int] = (1,),
        prompt: str = PROMPT,
    ) -> list[Reply]:
        """``n`` requests at once, round-robin over ``gateways`` (default: all), sizes cycled."""
        targets = itertools.cycle(gateways or range(len(self.cluster.gateways)))
        sizes = itertools.cycle(max_tokens)
        sends = [
            self.send(next(targets), tenant=tenant, max_tokens=next(sizes), prompt=prompt)
            for _ in range(n)
        ]
        return list(await asyncio.gather(*sends))

    async def open_loop(
        self,
        rate: float,
        duration_s: float,
        *,
        gateways: Sequence[int] | None = None,
        tenant: str | None = None,
        max_tokens: int = 1,
    ) -> list[Reply]:
        """``rate`` requests/s for ``duration_s`` (sent on schedule, not waiting for answers)."""
        targets = itertools.cycle(gateways or range(len(self.cluster.gateways)))
        start = time.monotonic()
        tasks = []
        for k in range(round(rate * duration_s)):
            await asyncio.sleep(max(0.0, start + k / rate - time.monotonic()))
            send = self.send(next(targets), tenant=tenant, max_tokens=max_tokens)
            tasks.append(asyncio.create_task(send))
        return list(await asyncio.gather(*tasks))

    async def admin_state(self, gateway: int) -> dict[str, Any]:
        """Gateway ``gateway``'s ``/admin/state``."""
        url = self.cluster.gateway_url(gateway) + "/admin/state"
        headers = {"Authorization": f"Bearer {ADMIN_KEY}"}
        async with self.session.get(url, headers=headers) as response:
            data: dict[str, Any] = orjson.loads(await response.read())
        return data

    async def metrics(self, gateway: int) -> str:
        """Gateway ``gateway``'s ``/metrics`` text."""
        async with self.session.get(self.cluster.gateway_url(gateway) + "/metrics") as response:
            return await response.text()

    async def engine_stats(self) -> dict[str, int]:
        """The engine's ``/emulator/stats`` now."""
        url = self.cluster.engine_url(self.model) + "/emulator/stats"
        async with self.session.get(url) as response:
            data: dict[str, int] = orjson.loads(await response.read())
        return data


@contextlib.asynccontextmanager
async def client(cluster: Cluster, model: str, timeout_s: float = 30.0) -> AsyncIterator[Client]:
    """A ``Client`` whose session is closed, and background work cancelled, on exit."""
    connector = aiohttp.TCPConnector(limit=0, force_close=False)
    async with aiohttp.ClientSession(connector=connector) as session:
        made = Client(cluster, model, session, timeout_s)
        try:
            yield made
        finally:
            for task in made.background:
                task.cancel()
            await asyncio.gather(*made.background, return_exceptions=True)


@dataclass
class ClosedLoop:
    """Workers that each send one request after another until stopped (``start``/``stop``).

    Attributes:
        replies: every finished request so far.
    """

    client: Client
    workers: Sequence[tuple[int, str | None]]
    max_tokens: int
    pause_after_error_s: float = 0.05
    replies: list[Reply] = field(default_factory=list)
    _stopping: bool = False
    _tasks: list[asyncio.Task[None]] = field(default_factory=list)

    def start(self) -> None:
        """Start one task per ``(gateway, tenant)`` worker."""
        self._tasks = [self.client.spawn(self._work(g, t)) for g, t in self.workers]

    async def _work(self, gateway: int, tenant: str | None) -> None:
        while not self._stopping:
            reply = await self.client.send(gateway, tenant=tenant, max_tokens=self.max_tokens)
            self.replies.append(reply)
            if reply.status == 0 and self.client.cluster.gateways[gateway].proc.poll() is not None:
                return  # its gateway was killed: this worker stops
            if reply.status != 200:
                await asyncio.sleep(self.pause_after_error_s)  # no busy loop on refusals

    async def stop(self) -> list[Reply]:
        """Let every worker finish its current request, then return all replies."""
        self._stopping = True
        await asyncio.gather(*self._tasks)
        return self.replies


@dataclass(frozen=True)
class EngineSample:
    """The engine's counts at one moment (``at``: ``time.monotonic()``)."""

    at: float
    running: int
    aborted_total: int


@dataclass
class RunningSampler:
    """Samples the engine's ``/emulator/stats`` every ``period_s`` in the background."""

    client: Client
    period_s: float = 0.02
    samples: list[EngineSample] = field(default_factory=list)
    _task: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Begin sampling."""
        self._task = self.client.spawn(self._run())

    async def _run(self) -> None:
        while True:
            stats = await self.client.engine_stats()
            sample = EngineSample(time.monotonic(), stats["running"], stats["aborted_total"])
            self.samples.append(sample)
            await asyncio.sleep(self.period_s)

    async def stop(self) -> list[EngineSample]:
        """Stop sampling; return the samples."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        return self.samples
