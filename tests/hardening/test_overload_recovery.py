"""Overload: the gateway recovers promptly from a load step, holds 10,000 waiting requests
cheaply, and refuses the excess at once.

The recovery test runs a gateway and a fast emulator in threads; the memory
test runs the gateway as its own process (``python -m sluicegate serve``) so
that its resident memory can be read from ``/proc/PID/status`` alone.
"""

from __future__ import annotations

import asyncio
import resource
import statistics
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import orjson
import pytest

from sluicegate.demo.processes import free_port
from tests.gateway.gateway_harness import (
    ADMIN_KEY,
    FAST_PRIORS,
    MODEL,
    engine_config,
    engine_server,
    model_state,
    open_stream,
    stack,
    wait_until,
)

SMALL = {"model": MODEL, "prompt": "hi", "max_tokens": 8, "ignore_eos": True}

# ------------------------------------------------------------------ recovery after a step

QUEUE_TIMEOUT_S = 1.0
SLOTS = 2
LANE = f"max_concurrency: {SLOTS}, max_queue: 1000, queue_timeout_s: {QUEUE_TIMEOUT_S}"
STEP = f"""    max_concurrency: {SLOTS}
{FAST_PRIORS}    lanes:
      - {{name: interactive, {LANE}}}
"""
# ~10 ms steps: 8 tokens take ~0.1 s, so two slots serve ~20 requests/s.
STEADY_ENGINE = engine_config(base_s=0.01, per_decode_seq_s=0.0, per_kv_token_s=0.0)
CAPACITY_RPS = 20.0


@dataclass(frozen=True)
class Sent:
    """One request of the load: when it was sent, how it ended and how long it took."""

    at: float
    status: int
    seconds: float


async def _load(
    session: aiohttp.ClientSession, url: str, phases: list[tuple[float, float]]
) -> list[list[Sent]]:
    """Open-loop load in back-to-back phases of (requests/s, seconds), whatever the answers;
    the requests sent in each phase."""

    async def one(at: float) -> Sent:
        async with session.post(url, json=SMALL) as response:
            await response.read()
        return Sent(at, response.status, time.monotonic() - at)

    sent: list[list[asyncio.Future[Sent]]] = []
    start = time.monotonic()
    for rate, duration_s in phases:
        sent.append([])
        for i in range(int(rate * duration_s)):
            delay = start + i / rate - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            sent[-1].append(asyncio.ensure_future(one(time.monotonic())))
        start += duration_s
    return [list(await asyncio.gather(*phase)) for phase in sent]


async def test_latency_returns_to_baseline_within_two_queue_timeouts_after_a_3x_step() -> None:
    """A quarter of capacity for 2 s, three times capacity for 2 s, a quarter again for 4 s:
    the step overloads the gateway (requests expire after the 1 s queue timeout), and every
    request sent more than two queue timeouts after the step ends (but one straggler) is
    served as fast as before it.

    Why two: the queue timeout empties the backlog left by the step within one timeout T;
    what arrives meanwhile (λT) drains at μ − λ, so recovery takes at most T·μ/(μ − λ),
    here 1.33 T.
    """
    with stack(STEP, engine=STEADY_ENGINE) as gateway:
        url = gateway.base_url + "/v1/completions"
        connector = aiohttp.TCPConnector(limit=0)
        timeout = aiohttp.ClientTimeout(total=30)
        async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
            phases = [(CAPACITY_RPS / 4, 2.0), (CAPACITY_RPS * 3, 2.0), (CAPACITY_RPS / 4, 4.0)]
            before, step, after = await _load(session, url, phases)
            step_end = max(sent.at for sent in step)
        idle = model_state(gateway.base_url)
    assert all(sent.status == 200 for sent in before), before
    baseline = [sent.seconds for sent in before]
    threshold = max(baseline) + 0.25  # the queue timeout is 1 s: a wait shows
    expired = sum(sent.status == 503 for sent in step)
    slow = [s.at - step_end for s in after if s.status != 200 or s.seconds > threshold]
    recovery_s = max(slow, default=0.0)
    late = [at for at in slow if at > 2 * QUEUE_TIMEOUT_S]
    print(f"baseline p50 {statistics.median(baseline) * 1000:.0f} ms, max"
          f" {max(baseline) * 1000:.0f} ms; step: {expired}/{len(step)} expired; recovered"
          f" {recovery_s:.2f} s after the step (bound {2 * QUEUE_TIMEOUT_S:.1f} s)")  # fmt: skip
    assert expired > 0, "the step did not overload the gateway"
    # One late straggler is a hiccup of a loaded CI machine; a backlog makes a run of them.
    assert len(late) <= 1, (late, threshold)
    assert all(s.status == 200 for s in after if s.at - step_end > 2 * QUEUE_TIMEOUT_S), after
    assert (idle["running"], idle["queued"]) == (0, 0)


# ------------------------------------------------------------------ 10,000 waiting requests

WAITING = 10_000
BOUND_PER_WAITING = 50 * 1024
REFUSALS = 300


def _config(engine_port: int, port: int) -> str:
    """One slot, room for ``WAITING`` in the queue, nobody expires during the test."""
    return f"""server: {{port: {port}, scrape_interval_s: 60}}
models:
  - name: {MODEL}
    backends:
      - {{name: e0, url: 'http://127.0.0.1:{engine_port}', engine: emulator}}
    max_concurrency: 1
{FAST_PRIORS}    lanes:
      - {{name: interactive, max_concurrency: 1, max_queue: {WAITING}, queue_timeout_s: 600}}
"""


def _rss_bytes(pid: int) -> int:
    """A process's resident set now (``VmRSS``)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for pid {pid}")


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=1) as response:
            return bool(response.status == 200)
    except OSError:
        return False


@contextmanager
def gateway_process(config: Path, port: int, log: Path) -> Iterator[subprocess.Popen[bytes]]:
    """``python -m sluicegate serve --config CONFIG`` as a child, answering on ``port``;
    stopped on exit."""
    with log.open("wb") as out:
        child = subprocess.Popen(
            [sys.executable, "-m", "sluicegate", "serve", "--config", str(config)],
            stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        url = f"http://127.0.0.1:{port}/healthz"
        wait_until(lambda: child.poll() is not None or _answers(url), 30, 0.1)
        if child.poll() is not None or not _answers(url):
            raise AssertionError(f"the gateway did not start:\n{log.read_text()}")
        yield child
    finally:
        child.terminate()
        try:
            child.wait(10)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()


@contextmanager
def _open_files(needed: int) -> Iterator[None]:
    """Raise this process's (and so its children's) open-file limit to ``needed`` (each
    process holds one end of every connection)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < needed:
        pytest.skip(f"holding {WAITING} connections needs {needed} open files; the hard limit"
                    f" is {hard}")  # fmt: skip
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, needed), hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


REQUEST = orjson.dumps(SMALL)
RAW = (
    b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
    b"Content-Length: %d\r\n\r\n%s" % (len(REQUEST), REQUEST)
)


async def _hold(port: int, count: int) -> list[asyncio.StreamWriter]:
    """``count`` connections, each with one request sent and its answer never read."""
    gate = asyncio.Semaphore(200)

    async def one() -> asyncio.StreamWriter:
        async with gate:
            _, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(RAW)
            await writer.drain()
            return writer

    return list(await asyncio.gather(*(one() for _ in range(count))))


async def _refused(port: int) -> tuple[float, bytes]:
    """One request on a fresh connection: seconds until its answer's head, and the head."""
    start = time.monotonic()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(RAW)
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
        return time.monotonic() - start, head
    finally:
        writer.close()


def _queued(base_url: str) -> int:
    return int(model_state(base_url)["queued"])


async def _wait_queued(base_url: str, count: int, within_s: float) -> bool:
    return await asyncio.to_thread(wait_until, lambda: _queued(base_url) == count, within_s, 0.2)


@dataclass(frozen=True)
class Held:
    """What holding ``WAITING`` requests in the gateway process showed."""

    baseline: int  # RSS after a warm-up, nothing queued
    held: int  # RSS with WAITING queued
    after: int  # RSS once they left again
    refusals: list[tuple[float, bytes]]  # requests beyond max_queue: seconds, answer head
    queued: int  # still queued after the refusals
    released: bool  # the queue emptied once the clients left


async def _hold_and_refuse(base_url: str, port: int, pid: int) -> Held:
    async with aiohttp.ClientSession() as session:
        holder = await open_stream(session, base_url, max_tokens=30_000)
        writers: list[asyncio.StreamWriter] = []
        try:
            warm = await _hold(port, 300)  # first-use allocations, caches, allocator arenas
            assert await _wait_queued(base_url, 300, 30)
            for writer in warm:
                writer.transport.abort()
            assert await _wait_queued(base_url, 0, 30)
            await asyncio.sleep(0.5)
            baseline = _rss_bytes(pid)
            writers = await _hold(port, WAITING)
            assert await _wait_queued(base_url, WAITING, 120), _queued(base_url)
            await asyncio.sleep(0.5)
            held = _rss_bytes(pid)
            refusals = [await _refused(port) for _ in range(REFUSALS)]
            queued = _queued(base_url)
        finally:
            for writer in writers:
                writer.transport.abort()
            holder.close()
        released = await _wait_queued(base_url, 0, 60)
        return Held(baseline, held, _rss_bytes(pid), refusals, queued, released)


async def test_ten_thousand_waiting_requests_are_cheap_and_the_excess_is_refused_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A gateway process whose single slot is busy holds 10,000 queued requests for less
    than 50 KB of resident memory each; with its queue full, 300 more requests are each
    refused with 429 and ``Retry-After``, p99 under 50 ms; when the clients leave, the
    queue empties."""
    monkeypatch.setenv("SLUICEGATE_ADMIN_KEY", ADMIN_KEY)
    port = free_port()
    config = tmp_path / "gateway.yaml"
    with _open_files(WAITING + 1000), engine_server(engine_config(base_s=0.05)) as engine:
        config.write_text(_config(engine.port, port))
        with gateway_process(config, port, tmp_path / "gateway.log") as child:
            seen = await _hold_and_refuse(f"http://127.0.0.1:{port}", port, child.pid)
    per_waiting = (seen.held - seen.baseline) / WAITING
    seconds = sorted(s for s, _ in seen.refusals)
    p50, p99 = statistics.median(seconds), seconds[int(0.99 * len(seconds)) - 1]
    print(f"gateway RSS {seen.baseline / 2**20:.1f} MB → {seen.held / 2**20:.1f} MB with"
          f" {WAITING} waiting: {per_waiting / 1024:.1f} KB each; after they left"
          f" {seen.after / 2**20:.1f} MB; 429 in p50 {p50 * 1000:.1f} ms, p99"
          f" {p99 * 1000:.1f} ms, max {seconds[-1] * 1000:.1f} ms")  # fmt: skip
    assert per_waiting < BOUND_PER_WAITING
    for _, head in seen.refusals:
        assert head.startswith(b"HTTP/1.1 429 "), head
        assert b"\r\nretry-after: " in head.lower(), head
    assert p99 < 0.05
    assert seen.queued == WAITING
    assert seen.released
