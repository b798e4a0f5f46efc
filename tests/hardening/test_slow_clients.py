"""Slow and vanishing clients cost the gateway a bounded amount, for a bounded time.

Real sockets on loopback against a real gateway and emulated engine (in threads):
slowloris headers and slow bodies are answered 408 and closed at their timeouts
without reaching the engine or holding a slot; a streaming client that stops
reading is held to the write-buffer cap and dropped after the stall timeout,
its engine request aborted; and hundreds of streams cut by their clients each
free their engine request within a second, leaving no tasks and no memory
behind.
"""

from __future__ import annotations

import asyncio
import functools
import random
import socket
import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import aiohttp
import orjson
import pytest
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from sluicegate.emulator import build_app as build_emulator
from sluicegate.engine import EngineConfig
from sluicegate.gateway.app import build_app as build_gateway
from tests.gateway.gateway_harness import (
    ADMIN_KEY,
    MODEL,
    RunningServer,
    engine_config,
    engine_stats,
    gateway_config,
    model_state,
    outcomes,
    serve_in_thread,
    start_server,
    stop_servers,
    wait_until,
)

HEADER_S = 0.5
BODY_S = 0.5
STALL_S = 0.5
WRITE_BUFFER = 4096  # the smallest cap the config allows
MARGIN_S = 1.5  # CI is a loaded 2-core machine
LIMITS = (
    f"server: {{client_header_timeout_s: {HEADER_S}, client_body_timeout_s: {BODY_S},"
    f" client_stall_timeout_s: {STALL_S}, client_write_buffer_bytes: {WRITE_BUFFER}}}\n"
)
ONE_SLOT = """    max_concurrency: 1
    lanes:
      - {name: interactive, max_concurrency: 1, max_queue: 8}
"""
SMALL = {"model": MODEL, "prompt": "hi", "max_tokens": 3, "ignore_eos": True}
T = TypeVar("T")


# ------------------------------------------------------------------ servers


@dataclass(frozen=True)
class Live:
    """A gateway (whose uvicorn server and loop the test can inspect) and its engine."""

    gateway: RunningServer
    engine_port: int

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.gateway.port}"

    @property
    def engine_url(self) -> str:
        return f"http://127.0.0.1:{self.engine_port}"

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        return self.gateway.server.servers[0].get_loop()

    def on_loop(self, fn: Callable[[], T]) -> T:
        """Run ``fn`` on the gateway's event loop thread and return its result."""

        async def call() -> T:
            return fn()

        return asyncio.run_coroutine_threadsafe(call(), self.loop).result(10)

    def task_count(self) -> int:
        """How many asyncio tasks the gateway's loop holds now."""
        return self.on_loop(lambda: len(asyncio.all_tasks()))

    def write_buffers(self) -> list[int]:
        """The transport write-buffer size of each open client connection."""
        connections = self.gateway.server.server_state.connections
        return self.on_loop(
            lambda: [c.transport.get_write_buffer_size() for c in connections if c.transport]
        )


@contextmanager
def live(
    body: str, engine: ASGIApp | None = None, *, config: EngineConfig | None = None
) -> Iterator[Live]:
    """An emulator (or ``engine``) and a gateway configured with ``body`` in front of it."""
    app = engine or build_emulator(config or engine_config(), model=MODEL)
    with serve_in_thread(app) as engine_port:
        gateway_app = build_gateway(
            gateway_config([engine_port], body),
            environ={"SLUICEGATE_ADMIN_KEY": ADMIN_KEY},
            scrape=False,
        )
        running = start_server(gateway_app)
        try:
            yield Live(running, engine_port)
        finally:
            stop_servers([running])


def _idle(gateway: Live) -> bool:
    state = model_state(gateway.base_url)
    return (state["running"], state["queued"]) == (0, 0)


def _served_quickly(gateway: Live) -> float:
    """Seconds a short completion takes end to end; asserts it succeeded."""
    start = time.monotonic()
    with socket.create_connection(("127.0.0.1", gateway.gateway.port), timeout=5) as sock:
        sock.sendall(_request(orjson.dumps(SMALL)))
        reply = _read_all(sock, 5.0)
    assert reply.startswith(b"HTTP/1.1 200"), reply[:200]
    return time.monotonic() - start


# ------------------------------------------------------------------ raw HTTP


def _request(body: bytes, *, length: int | None = None) -> bytes:
    head = (
        "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body) if length is None else length}\r\nConnection: close\r\n\r\n"
    )
    return head.encode() + body


def _read_all(sock: socket.socket, timeout: float) -> bytes:
    """Everything until the server closes (or resets) the connection."""
    sock.settimeout(timeout)
    data = b""
    try:
        while chunk := sock.recv(65536):
            data += chunk
    except ConnectionResetError:
        pass
    return data


@dataclass(frozen=True)
class Cutoff:
    """How a connection that kept sending slowly ended."""

    seconds: float  # from the first byte sent to the server closing the connection
    reply: bytes  # what the server wrote before closing (b"" if it just closed)


def _trickle(port: int, data: bytes, every_s: float, *, prefix: bytes = b"") -> Cutoff:
    """Send ``prefix`` with the first byte of ``data``, then the rest one byte every
    ``every_s``, until the server closes the connection; fail if it is still open after all
    of ``data``."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        start = time.monotonic()
        for i, byte in enumerate(data):
            try:
                sock.sendall(prefix + bytes([byte]) if i == 0 else bytes([byte]))
            except (BrokenPipeError, ConnectionResetError):
                return Cutoff(time.monotonic() - start, _read_all(sock, 1.0))
            sock.settimeout(every_s)
            try:
                chunk = sock.recv(65536)
            except TimeoutError:
                continue
            except ConnectionResetError:
                chunk = b""
            seconds = time.monotonic() - start
            return Cutoff(seconds, chunk + _read_all(sock, 1.0) if chunk else b"")
    raise AssertionError(f"the connection was still open after {len(data)} slow bytes")


def _assert_timed_out(cutoff: Cutoff, timeout_s: float, code: str) -> None:
    """Closed between the timeout and the timeout plus the margin, with 408 ``code`` if it
    answered before closing."""
    assert timeout_s - 0.05 <= cutoff.seconds <= timeout_s + MARGIN_S, cutoff
    if cutoff.reply:
        assert cutoff.reply.startswith(b"HTTP/1.1 408 "), cutoff.reply
        assert code.encode() in cutoff.reply, cutoff.reply


# ------------------------------------------------------------------ slow requests

SLOW_HEAD = _request(orjson.dumps(SMALL))


@pytest.mark.parametrize(
    "prefix",
    [b"", b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"],
    ids=["line", "headers"],
)
def test_headers_sent_slower_than_the_header_timeout_are_cut_off(prefix: bytes) -> None:
    """A request whose headers dribble in a byte every 0.1 s (slower than the 0.5 s header
    timeout allows) is answered 408 ``header_timeout`` (or just closed) within the timeout
    plus a margin, and nothing reaches the engine."""
    with live(LIMITS) as gateway:
        cutoff = _trickle(gateway.gateway.port, SLOW_HEAD[len(prefix) :], 0.1, prefix=prefix)
        stats = engine_stats(gateway.engine_url)
        idle = _idle(gateway)
    _assert_timed_out(cutoff, HEADER_S, "header_timeout")
    assert stats["admitted_total"] == 0
    assert idle


async def test_many_slowloris_connections_are_all_cut_and_do_not_block_others() -> None:
    """Forty connections trickling their headers at once: each is closed within the header
    timeout plus a margin, and meanwhile a normal request is served at once."""

    async def slowloris() -> float:
        reader, writer = await asyncio.open_connection("127.0.0.1", gateway.gateway.port)
        start = time.monotonic()
        try:
            for byte in SLOW_HEAD:
                writer.write(bytes([byte]))
                try:
                    if await asyncio.wait_for(reader.read(65536), 0.1) == b"":
                        break
                except TimeoutError:
                    continue
                await reader.read()  # the 408, then EOF
                break
            else:
                raise AssertionError("a slowloris connection was never cut")
        except ConnectionError:
            pass
        finally:
            writer.close()
        return time.monotonic() - start

    with live(LIMITS) as gateway:
        cut = asyncio.gather(*(slowloris() for _ in range(40)))
        await asyncio.sleep(0.2)
        served_s = await asyncio.to_thread(_served_quickly, gateway)
        seconds = await cut
        stats = engine_stats(gateway.engine_url)
    assert served_s < 1.0
    assert max(seconds) <= HEADER_S + MARGIN_S, seconds
    assert min(seconds) >= HEADER_S - 0.05, seconds
    assert stats["admitted_total"] == 1  # only the normal request


@pytest.mark.parametrize("trickle", [False, True], ids=["stalled", "trickled"])
def test_body_slower_than_the_body_timeout_is_cut_off_without_holding_a_slot(
    trickle: bool,
) -> None:
    """A body announced as 1000 bytes that stops after 20 (or dribbles a byte every 0.1 s)
    gets 408 ``body_timeout`` (or a close) within the body timeout plus a margin; the engine
    never sees it, nothing is queued or running, and the one slot serves the next request
    at once."""
    with live(ONE_SLOT + LIMITS) as gateway:
        head = _request(b'{"model": "tiny", "p', length=1000)
        if trickle:
            cutoff = _trickle(gateway.gateway.port, b"x" * 100, 0.1, prefix=head)
        else:
            with socket.create_connection(("127.0.0.1", gateway.gateway.port)) as sock:
                start = time.monotonic()
                sock.sendall(head)
                reply = _read_all(sock, BODY_S + MARGIN_S + 1.0)
                cutoff = Cutoff(time.monotonic() - start, reply)
        stats = engine_stats(gateway.engine_url)
        idle = _idle(gateway)
        served_s = _served_quickly(gateway)
        counted = outcomes(gateway.base_url)
    _assert_timed_out(cutoff, BODY_S, "body_timeout")
    assert stats["admitted_total"] == 0
    assert idle
    assert served_s < 1.0
    assert counted == {"completed": 1}


# ------------------------------------------------------------------ a client that stops reading


def test_streaming_client_that_never_reads_is_bounded_and_dropped() -> None:
    """A stream to a client that never reads (small receive buffer and segments, so the
    kernel's buffers fill within a second): the gateway's write buffer for it stays within
    the cap plus one relayed read, and ``client_stall_timeout_s`` after its last write the
    connection is dropped, the engine request aborted, nothing is left running and the
    request is counted as ``cancelled``."""
    body = orjson.dumps({**SMALL, "max_tokens": 20_000, "stream": True})
    fast = engine_config(base_s=0.001, per_decode_seq_s=0.0, per_kv_token_s=0.0)
    with live(LIMITS, config=fast) as gateway:
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        # Loopback's 64 KiB segments would let the kernel buffer megabytes first.
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_MAXSEG, 1024)
        with sock:
            sock.connect(("127.0.0.1", gateway.gateway.port))
            sock.sendall(_request(body))
            samples: list[tuple[float, int]] = []
            start = time.monotonic()
            while time.monotonic() - start < 15:
                buffers = gateway.write_buffers()
                now = time.monotonic()
                if not buffers:
                    break
                samples.append((now, buffers[0]))
                time.sleep(0.02)
            dropped_at = time.monotonic()
            aborted = wait_until(lambda: engine_stats(gateway.engine_url)["aborted_total"] == 1, 2)
            stats = engine_stats(gateway.engine_url)
            idle = _idle(gateway)
            counted = outcomes(gateway.base_url)
            received = _read_all(sock, 2.0)
    assert samples, "the connection was gone before it could be sampled"
    assert dropped_at - start < 15, "the stalled client was never dropped"
    last = samples[-1][1]
    changed = (t for t, size in reversed(samples) if size != last)
    blocked_at = next(changed, samples[0][0] - 0.02) + 0.02  # the first sample at ``last``
    held = dropped_at - blocked_at
    peak = max(size for _, size in samples)
    print(f"write buffer peak {peak} B (cap {WRITE_BUFFER}); dropped {held:.2f} s after the "
          f"last write; client had {len(received)} B buffered")  # fmt: skip
    assert last >= WRITE_BUFFER, samples[-5:]  # it was blocked on the cap when dropped
    assert peak <= WRITE_BUFFER + 40 * 1024
    assert STALL_S - 0.1 <= held <= STALL_S + MARGIN_S
    assert aborted
    assert (stats["running"], stats["finished_total"]) == (0, 0)
    assert idle
    assert counted == {"cancelled": 1}
    assert b"[DONE]" not in received


# ------------------------------------------------------------------ many clients that leave


class AbortClock:
    """Wraps the emulator: records when each request's connection is closed by the gateway
    (the emulator aborts the request in the same step), keyed by ``X-Request-Id``."""

    def __init__(self, app: ASGIApp) -> None:
        self._app = app
        self.closed_at: dict[str, float] = {}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Serve through the emulator, timing the ``http.disconnect`` it receives."""
        if scope["type"] != "http":
            await self._app(scope, receive, send)
            return
        request_id = dict(scope["headers"]).get(b"x-request-id", b"").decode()

        async def timed() -> Message:
            message = await receive()
            if message["type"] == "http.disconnect" and request_id:
                self.closed_at.setdefault(request_id, time.monotonic())
            return message

        await self._app(scope, timed, send)

    def saw_all(self, request_ids: set[str]) -> bool:
        """Whether every one of ``request_ids`` has been closed."""
        return request_ids <= self.closed_at.keys()


STREAMS = 500  # per cycle
CYCLES = 3
CONCURRENCY = 64
MANY = """    max_concurrency: 1000
    lanes:
      - {name: interactive, max_concurrency: 1000, max_queue: 100}
"""
# 50 steps/s, a batch of up to 1024: each stream gets a chunk every ~20 ms.
WIDE = engine_config(
    max_num_seqs=1024, base_s=0.02, per_decode_seq_s=0.0, per_kv_token_s=0.0,
    kv_capacity_tokens=1024 * 1024,
)  # fmt: skip


async def _cut_stream(
    session: aiohttp.ClientSession, base_url: str, chunks: int, closed: dict[str, float]
) -> None:
    """Stream a long completion, read ``chunks`` data events, then close the connection."""
    body = {**SMALL, "max_tokens": 1000, "stream": True}
    response = await session.post(base_url + "/v1/completions", json=body)
    assert response.status == 200, await response.read()
    request_id = ""
    seen = 0
    while seen < chunks:
        line = await response.content.readline()
        assert line, "the stream ended early"
        if line.startswith(b"data:"):
            seen += 1
            if not request_id:
                request_id = orjson.loads(line[5:])["id"].removeprefix("cmpl-")
    closed[request_id] = time.monotonic()
    response.close()


async def _cycle(base_url: str, rng: random.Random, count: int) -> dict[str, float]:
    """``count`` streams, ``CONCURRENCY`` at a time, each cut after 1–4 chunks; when each
    client closed, by engine request id."""
    closed: dict[str, float] = {}
    gate = asyncio.Semaphore(CONCURRENCY)
    connector = aiohttp.TCPConnector(limit=0, force_close=True)
    async with aiohttp.ClientSession(connector=connector) as session:

        async def one(chunks: int) -> None:
            async with gate:
                await _cut_stream(session, base_url, chunks, closed)

        await asyncio.gather(*(one(rng.randint(1, 4)) for _ in range(count)))
    return closed


def _rss_bytes() -> int:
    """This process's resident set (the gateway runs in one of its threads)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS in /proc/self/status")


async def test_streams_cut_by_their_clients_free_everything_promptly() -> None:
    """500 streams per cycle, each closed by its client after 1–4 chunks: ≥ 99% of the
    engine requests are closed within 1 s of their client's close, nothing stays running
    or queued, and over three cycles (after a warm-up) the gateway's asyncio tasks return
    to their baseline and the process's memory grows by less than 20 MB."""
    clock = AbortClock(build_emulator(WIDE, model=MODEL))
    rng = random.Random(7)
    with live(MANY, clock) as gateway:
        await _cycle(gateway.base_url, rng, 100)  # warm-up: pools, caches, allocator arenas
        assert await asyncio.to_thread(wait_until, lambda: _idle(gateway), 3.0)
        tasks_before = await asyncio.to_thread(gateway.task_count)
        rss_before = _rss_bytes()
        latencies: list[float] = []
        tasks_after: list[int] = []
        rss_after: list[int] = []
        for _ in range(CYCLES):
            closed = await _cycle(gateway.base_url, rng, STREAMS)
            assert len(closed) == STREAMS
            assert await asyncio.to_thread(wait_until, lambda: _idle(gateway), 3.0)
            # An engine request still open a second after the last client left counts as late.
            await asyncio.to_thread(wait_until, functools.partial(clock.saw_all, set(closed)), 1.0)
            aborted = dict(clock.closed_at)
            latencies += [aborted.get(rid, float("inf")) - at for rid, at in closed.items()]
            settled = await asyncio.to_thread(
                wait_until, lambda: gateway.task_count() <= tasks_before, 3.0, 0.05
            )
            tasks_after.append(await asyncio.to_thread(gateway.task_count))
            rss_after.append(_rss_bytes())
            assert settled, (tasks_before, tasks_after)
        stats = engine_stats(gateway.engine_url)
        counted = outcomes(gateway.base_url)
    latencies.sort()
    within = sum(lat <= 1.0 for lat in latencies) / len(latencies)
    p50 = statistics.median(latencies)
    p99 = latencies[int(0.99 * len(latencies)) - 1]
    growth_mb = [(rss - rss_before) / 2**20 for rss in rss_after]
    print(f"engine close after client close: p50 {p50 * 1000:.1f} ms, p99 {p99 * 1000:.1f} ms,"
          f" max {latencies[-1] * 1000:.1f} ms; within 1 s {within:.2%}; tasks {tasks_before}"
          f" → {tasks_after}; RSS growth {[f'{g:.1f}' for g in growth_mb]} MB")  # fmt: skip
    assert within >= 0.99
    assert stats["running"] == 0
    assert stats["aborted_total"] == 100 + CYCLES * STREAMS
    assert counted == {"cancelled": 100 + CYCLES * STREAMS}
    assert max(growth_mb) < 20.0
