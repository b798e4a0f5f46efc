"""The gateway's injectable scheduling clock: queue timeouts and rate-limit refills pass when
a test advances an ``OffsetClock``, over real HTTP in front of a real emulated engine."""

from __future__ import annotations

import asyncio
import time

import aiohttp
import pytest

from sluicegate.gateway.clock import OffsetClock
from tests.gateway.clock_harness import clocked_gateway
from tests.gateway.gateway_harness import (
    FAST_PRIORS,
    assert_retry_headers,
    engine_server,
    model_state,
    openai_error,
)
from tests.gateway.small_requests import post_small, queue_behind_stream

TIMEOUT_S = 600.0
LONG_QUEUE = f"""    max_concurrency: 1
{FAST_PRIORS}    lanes:
      - {{name: interactive, max_concurrency: 1, max_queue: 4, queue_timeout_s: {TIMEOUT_S}}}
"""
PER_S = 0.01  # one request per 100 s
SLOW_TENANT = f"""tenants:
  - {{name: a, api_key_env: KEY_A, requests_per_s: {PER_S}, burst_requests: 1}}
"""


def test_offset_clock_moves_with_time_and_jumps_forward_only() -> None:
    """An ``OffsetClock`` reads monotonic time plus what was advanced, and refuses to go
    back."""
    clock = OffsetClock()
    before = time.monotonic()
    clock.advance(100.0)
    reading = clock()
    assert before + 100.0 <= reading <= time.monotonic() + 100.0
    with pytest.raises(ValueError, match="only moves forward"):
        clock.advance(-1.0)


async def test_a_queue_timeout_passes_when_the_clock_is_advanced() -> None:
    """A request queued behind a running one with a 600 s queue timeout is still queued after
    0.3 s of real time; advancing the gateway's clock by 600 s expires it at once: 503
    ``queue_timeout`` with retry headers, within 2 s of real time in all."""
    with engine_server() as engine, clocked_gateway([engine.port], LONG_QUEUE) as (gw, clock):
        async with aiohttp.ClientSession() as session:
            holder, waiting, queued = await queue_behind_stream(session, gw, post_small)
            await asyncio.sleep(0.3)
            still_queued = not waiting.done() and model_state(gw.base_url)["queued"] == 1
            clock.advance(TIMEOUT_S)
            elapsed, reply = await asyncio.wait_for(waiting, 5.0)
            holder.close()
    assert queued
    assert still_queued
    assert reply.status == 503
    assert openai_error(reply)["code"] == "queue_timeout"
    assert_retry_headers(reply)
    assert elapsed < 2.0


def test_a_rate_limit_refills_when_the_clock_is_advanced() -> None:
    """A tenant allowed one request per 100 s (burst 1) is refused the second with a
    retry-after of about 100 s; once the gateway's clock has moved 100 s on, the third is
    served."""
    env = {"KEY_A": "sk-slow"}
    with (
        engine_server() as engine,
        clocked_gateway([engine.port], SLOW_TENANT, environ=env) as (gw, clock),
    ):
        first, second = post_small(gw, "sk-slow")[1], post_small(gw, "sk-slow")[1]
        clock.advance(1.0 / PER_S)
        third = post_small(gw, "sk-slow")[1]
    assert (first.status, second.status, third.status) == (200, 429, 200)
    assert 99_000 <= int(second.headers["retry-after-ms"]) <= 100_000
