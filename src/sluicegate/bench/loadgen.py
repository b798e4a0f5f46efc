"""Open-loop HTTP load generator for OpenAI-compatible endpoints.

Open loop: each request starts at its scheduled time (``arrival_s`` seconds after the
run starts) whether or not earlier requests have been answered, so a slow server
meets the offered load instead of quietly slowing the generator down ("coordinated
omission"). A dispatcher sleeps until each start on ``loop.time()`` and spawns one
task per request; it never waits for a response.

Reading the generator's own ceiling: every record keeps ``launch_lag_s``, how late
its request actually started. While ``LoadResult.launch_lag_p99_s`` stays in the low
milliseconds (``keeping_up()``), the measured latencies are the server's; when it
grows, the generator (its event loop, CPU or sockets) could not launch at the
offered rate and ``launch_rps`` falls below ``offered_rps``: lower the rate, or run
several generators and merge their CSVs.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

import aiohttp
import numpy as np
import orjson

from sluicegate.bench.records import (
    CLIENT_TIMEOUT,
    CONNECTION_ERROR,
    INVALID_RESPONSE,
    STREAM_INTERRUPTED,
    RequestRecord,
)
from sluicegate.bench.response_parsing import StreamStats, error_code, parse_float
from sluicegate.outcomes import WorkloadRequest

Endpoint = Literal["chat", "completions"]

LANE_HEADER = "X-Sluicegate-Lane"
PRIORITY_HEADER = "X-Sluicegate-Priority"
DEADLINE_HEADER = "X-Sluicegate-Deadline-Ms"
QUEUE_MS_HEADER = "X-Sluicegate-Queue-Ms"

DEFAULT_MAX_LAG_S = 0.005
"""Launch-lag p99 under which ``LoadResult.keeping_up`` holds."""

_FILLER = (
    "the quick brown fox jumps over the lazy dog while a patient sluice keeper "
    "opens one gate at a time so that the river never floods the valley below "
)


def synthetic_prompt(index: int, prompt_tokens: int) -> str:
    """A deterministic prompt of ``max(1, prompt_tokens) * 4`` characters.

    It starts with the request's index so that no two requests share a long prefix
    (a prefix cache would otherwise make every prompt nearly free).
    """
    length = max(1, prompt_tokens) * 4
    head = f"Request {index}: "
    body = _FILLER * (length // len(_FILLER) + 1)
    return (head + body)[:length]


def build_body(
    request: WorkloadRequest,
    index: int,
    *,
    model: str,
    endpoint: Endpoint,
    stream: bool,
    ignore_eos: bool,
) -> dict[str, object]:
    """The JSON body of one request (OpenAI chat or completions, plus vLLM's ``ignore_eos``)."""
    prompt = synthetic_prompt(index, request.prompt_tokens)
    body: dict[str, object] = {"model": model, "max_tokens": request.max_tokens, "stream": stream}
    if endpoint == "chat":
        body["messages"] = [{"role": "user", "content": prompt}]
    else:
        body["prompt"] = prompt
    if stream:
        body["stream_options"] = {"include_usage": True}
    if ignore_eos:
        body["ignore_eos"] = True
    return body


def build_headers(
    request: WorkloadRequest, *, api_keys: Mapping[str, str], send_lane_headers: bool
) -> dict[str, str]:
    """The request's headers: the tenant's bearer key (if it has one) and the lane headers."""
    headers = {"Content-Type": "application/json"}
    key = api_keys.get(request.tenant)
    if key:
        headers["Authorization"] = f"Bearer {key}"
    if send_lane_headers:
        headers[LANE_HEADER] = request.lane
        headers[PRIORITY_HEADER] = str(request.priority)
        if request.deadline_ms is not None:
            headers[DEADLINE_HEADER] = str(round(request.deadline_ms))
    return headers


def endpoint_url(base_url: str, endpoint: Endpoint) -> str:
    """The endpoint's URL; ``base_url`` may end with ``/v1`` (OpenAI SDK style) or not."""
    base = base_url.rstrip("/")
    if not base.endswith("/v1"):
        base += "/v1"
    return base + ("/chat/completions" if endpoint == "chat" else "/completions")


@dataclass(frozen=True, slots=True)
class LoadResult:
    """What one ``run_load`` measured.

    Attributes:
        records: one per scheduled request, in schedule order.
        duration_s: wall time from the start of the run (schedule time 0) until the last
            request ended.
        offered_rps: the schedule's rate, ``(n − 1) / (last − first scheduled start)``.
        launch_rps: the same over actual launch times: what the generator achieved.
        launch_lag_p50_s: median launch lag.
        launch_lag_p99_s: 99th-percentile launch lag (the generator's ceiling signal).
        launch_lag_max_s: worst launch lag.
    """

    records: tuple[RequestRecord, ...]
    duration_s: float
    offered_rps: float
    launch_rps: float
    launch_lag_p50_s: float
    launch_lag_p99_s: float
    launch_lag_max_s: float

    @classmethod
    def of(cls, records: Sequence[RequestRecord], duration_s: float) -> LoadResult:
        """Derive the rates and lag statistics from ``records``."""
        lags = np.asarray([r.launch_lag_s for r in records] or [0.0], dtype=np.float64)
        p50, p99 = (float(x) for x in np.percentile(lags, (50.0, 99.0), method="linear"))
        return cls(
            records=tuple(records),
            duration_s=duration_s,
            offered_rps=_rate([r.scheduled_s for r in records]),
            launch_rps=_rate([r.launched_s for r in records]),
            launch_lag_p50_s=p50,
            launch_lag_p99_s=p99,
            launch_lag_max_s=float(lags.max()),
        )

    def keeping_up(self, max_lag_p99_s: float = DEFAULT_MAX_LAG_S) -> bool:
        """Whether the generator launched on schedule (lag p99 within ``max_lag_p99_s``)."""
        return self.launch_lag_p99_s <= max_lag_p99_s


def _rate(times: Sequence[float]) -> float:
    span = max(times, default=0.0) - min(times, default=0.0)
    return (len(times) - 1) / span if len(times) > 1 and span > 0.0 else math.nan


@dataclass(frozen=True, slots=True)
class _Options:
    url: str
    model: str
    api_keys: Mapping[str, str]
    endpoint: Endpoint
    stream: bool
    ignore_eos: bool
    send_lane_headers: bool


async def run_load(
    schedule: Sequence[WorkloadRequest],
    *,
    base_url: str,
    model: str,
    api_keys: Mapping[str, str],
    stream: bool = True,
    ignore_eos: bool = True,
    endpoint: Endpoint = "chat",
    send_lane_headers: bool = True,
    timeout_s: float = 120.0,
    on_record: Callable[[RequestRecord], None] | None = None,
) -> LoadResult:
    """Replay ``schedule`` open-loop against an OpenAI-compatible server.

    Args:
        schedule: the requests; each starts ``arrival_s`` after the run starts (the
            schedule need not be sorted; records keep its order).
        base_url: server root, e.g. ``http://127.0.0.1:8000`` (a trailing ``/v1`` is fine).
        model: the ``model`` sent.
        api_keys: tenant → API key, sent as ``Authorization: Bearer``; a tenant
            without one is sent no key. Keys are never logged or recorded.
        stream: request SSE streaming (TTFT and inter-token gaps are measured only then).
        ignore_eos: send vLLM's ``ignore_eos`` so outputs run to ``max_tokens``.
        endpoint: ``/v1/chat/completions`` or ``/v1/completions``.
        send_lane_headers: send the lane, priority and deadline headers.
        timeout_s: per-request limit; a request past it is recorded with status 0
            (or its status, if headers had arrived) and error ``"timeout"``.
        on_record: called with each record as its request ends (for live progress);
            an exception from it cancels the run and surfaces in an ``ExceptionGroup``.

    Cancelling the call cancels every request in flight and closes the session.

    Raises:
        ValueError: an arrival is negative or ``timeout_s`` is not positive.
    """
    if any(r.arrival_s < 0.0 for r in schedule):
        raise ValueError("arrival_s must be ≥ 0")
    if not timeout_s > 0.0:
        raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
    options = _Options(
        url=endpoint_url(base_url, endpoint),
        model=model,
        api_keys=api_keys,
        endpoint=endpoint,
        stream=stream,
        ignore_eos=ignore_eos,
        send_lane_headers=send_lane_headers,
    )
    records: list[RequestRecord] = []

    def done(record: RequestRecord) -> None:
        records.append(record)
        if on_record is not None:
            on_record(record)

    # limit=0: no cap on connections, so a backlog of slow responses never delays a launch.
    connector = aiohttp.TCPConnector(limit=0, force_close=False)
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        duration_s = await _dispatch(schedule, session, options, done)
    records.sort(key=lambda r: r.index)
    return LoadResult.of(records, duration_s)


async def _dispatch(
    schedule: Sequence[WorkloadRequest],
    session: aiohttp.ClientSession,
    options: _Options,
    done: Callable[[RequestRecord], None],
) -> float:
    """Launch every request at its start time; return the wall time until all ended."""
    loop = asyncio.get_running_loop()
    order = sorted(range(len(schedule)), key=lambda i: schedule[i].arrival_s)
    start = loop.time()
    async with asyncio.TaskGroup() as group:
        for index in order:
            request = schedule[index]
            target = start + request.arrival_s
            delay = target - loop.time()
            if delay > 0.0:
                await asyncio.sleep(delay)
            group.create_task(_send(session, options, index, request, target, done))
    return loop.time() - start


async def _send(
    session: aiohttp.ClientSession,
    options: _Options,
    index: int,
    request: WorkloadRequest,
    target: float,
    done: Callable[[RequestRecord], None],
) -> None:
    loop = asyncio.get_running_loop()
    launched = loop.time()
    body = orjson.dumps(
        build_body(
            request,
            index,
            model=options.model,
            endpoint=options.endpoint,
            stream=options.stream,
            ignore_eos=options.ignore_eos,
        )
    )
    headers = build_headers(
        request, api_keys=options.api_keys, send_lane_headers=options.send_lane_headers
    )
    outcome = _Outcome(launched)
    try:
        async with session.post(options.url, data=body, headers=headers) as response:
            await outcome.read(response, loop)
    except TimeoutError:
        outcome.fail(CLIENT_TIMEOUT, loop.time())
    except aiohttp.ClientPayloadError:
        outcome.fail(STREAM_INTERRUPTED, loop.time())
    except (aiohttp.ClientError, OSError):
        outcome.fail(CONNECTION_ERROR if outcome.status == 0 else STREAM_INTERRUPTED, loop.time())
    done(outcome.record(index, request, max(0.0, launched - target)))


class _Outcome:
    """Mutable result of one request while its response is read."""

    __slots__ = ("ended", "error", "launched", "queue_ms", "retry_after_s", "stats", "status")

    def __init__(self, launched: float) -> None:
        self.launched = launched
        self.status = 0
        self.error = ""
        self.queue_ms: float | None = None
        self.retry_after_s: float | None = None
        self.ended: float | None = None
        self.stats = StreamStats()

    async def read(self, response: aiohttp.ClientResponse, loop: asyncio.AbstractEventLoop) -> None:
        """Read the whole response, timing its content chunks."""
        self.status = response.status
        self.queue_ms = parse_float(response.headers.get(QUEUE_MS_HEADER))
        retry_ms = parse_float(response.headers.get("retry-after-ms"))
        self.retry_after_s = (
            retry_ms / 1000.0
            if retry_ms is not None
            else parse_float(response.headers.get("Retry-After"))
        )
        if response.status >= 400:
            self.error = error_code(await response.read())
        elif response.content_type == "text/event-stream":
            await self._read_stream(response, loop)
        else:
            body = await response.read()
            if not self.stats.feed_json(body, loop.time()):
                self.error = INVALID_RESPONSE
        self.ended = loop.time()
        if not self.error:
            self.error = self.stats.error

    async def _read_stream(
        self, response: aiohttp.ClientResponse, loop: asyncio.AbstractEventLoop
    ) -> None:
        try:
            async for line in response.content:
                self.stats.feed_line(line, loop.time())
        except ValueError:  # a line longer than aiohttp's read buffer
            self.error = INVALID_RESPONSE
        self.stats.feed_line(b"", loop.time())  # dispatch an event left without a blank line

    def fail(self, error: str, now: float) -> None:
        """The request failed with client-side ``error`` at ``now``."""
        self.error = error
        self.ended = now

    def record(self, index: int, request: WorkloadRequest, lag_s: float) -> RequestRecord:
        """The frozen record of this request."""
        stats = self.stats
        ended = self.ended if self.ended is not None else self.launched
        end = stats.done_s if stats.done_s is not None else ended
        first = stats.first_s
        if first is None and not stats.streamed and 200 <= self.status < 300:
            first = end  # a non-streamed answer arrives all at once
        return RequestRecord(
            index=index,
            tenant=request.tenant,
            lane=request.lane,
            priority=request.priority,
            prompt_tokens=request.prompt_tokens,
            max_tokens=request.max_tokens,
            deadline_ms=request.deadline_ms,
            scheduled_s=request.arrival_s,
            launch_lag_s=lag_s,
            status=self.status,
            error=self.error,
            queue_ms=self.queue_ms,
            retry_after_s=self.retry_after_s,
            ttft_s=None if first is None else first - self.launched,
            e2e_s=end - self.launched,
            output_tokens=stats.output_tokens,
            itl_mean_s=stats.itl_mean_s,
            itl_max_s=stats.itl_max_s,
            finish_reason=stats.finish_reason,
        )
