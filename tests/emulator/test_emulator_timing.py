"""Real-time behaviour: inter-token gaps from the engine's step times, continuous batching."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Callable
from contextlib import AbstractContextManager

import aiohttp

from sluicegate.engine import EngineConfig
from tests.emulator.emulator_harness import MODEL, LiveEmulator


def _body(max_tokens: int, *, stream: bool) -> dict[str, object]:
    return {
        "model": MODEL, "prompt": "hello", "max_tokens": max_tokens,
        "ignore_eos": True, "stream": stream,
    }  # fmt: skip


async def _stream_arrivals(
    session: aiohttp.ClientSession, url: str, max_tokens: int
) -> list[float]:
    """POST a streaming completion; the monotonic arrival time of each token chunk."""
    arrivals: list[float] = []
    async with session.post(url, json=_body(max_tokens, stream=True)) as resp:
        assert resp.status == 200
        async for line in resp.content:
            if line.startswith(b"data: {") and b'"text":""' not in line:
                arrivals.append(time.monotonic())
    return arrivals


async def _complete(session: aiohttp.ClientSession, url: str, max_tokens: int) -> int:
    async with session.post(url, json=_body(max_tokens, stream=False)) as resp:
        body = await resp.json()
    tokens: int = body["usage"]["completion_tokens"]
    return tokens


async def test_stream_spreads_tokens_over_the_engine_decode_time(emulator: LiveEmulator) -> None:
    """Token chunks arrive spread over at least half the engine's predicted decode time
    (the solo service time minus the prefill step that emits token 1)."""
    tokens = 80
    async with aiohttp.ClientSession() as session:
        arrivals = await _stream_arrivals(session, emulator.base_url + "/v1/completions", tokens)
    cfg = emulator.config
    decode_s = cfg.solo_service_s(2, tokens) - cfg.step_s(2, 0, 2)
    assert len(arrivals) == tokens
    assert arrivals[-1] - arrivals[0] >= 0.5 * decode_s


async def test_concurrent_requests_share_steps(emulator: LiveEmulator) -> None:
    """N concurrent requests finish in far less than N times one request's time."""
    url = emulator.base_url + "/v1/completions"
    n, tokens = 16, 100
    async with aiohttp.ClientSession() as session:
        start = time.monotonic()
        await _complete(session, url, tokens)
        single_s = time.monotonic() - start
        start = time.monotonic()
        counts = await asyncio.gather(*(_complete(session, url, tokens) for _ in range(n)))
        together_s = time.monotonic() - start
    assert counts == [tokens] * n
    assert together_s < 0.25 * n * single_s


async def test_burst_never_runs_more_than_max_num_seqs(
    tiny: EngineConfig, start_emulator: Callable[..., AbstractContextManager[LiveEmulator]]
) -> None:
    """A burst larger than max_num_seqs queues: the running batch never exceeds it,
    and every request still completes."""
    config = dataclasses.replace(tiny, max_num_seqs=4)
    with start_emulator(config) as live:
        async with aiohttp.ClientSession() as session:
            url = live.base_url + "/v1/completions"
            counts = await asyncio.gather(*(_complete(session, url, 30) for _ in range(12)))
        stats = live.stats()
    assert counts == [30] * 12
    assert stats["max_running_seen"] == 4
    assert stats["finished_total"] == 12
