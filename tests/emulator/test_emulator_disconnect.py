"""A client that goes away aborts its request in the engine at once, freeing its KV."""

from __future__ import annotations

import asyncio
import dataclasses
import urllib.request
from collections.abc import Callable
from contextlib import AbstractContextManager

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from sluicegate.engine import EngineConfig
from tests.emulator.emulator_harness import MODEL, LiveEmulator

LONG = {"model": MODEL, "prompt": "hello", "max_tokens": 5000, "ignore_eos": True}


def _abort_count(live: LiveEmulator) -> float:
    with urllib.request.urlopen(live.base_url + "/metrics", timeout=5) as resp:
        text = resp.read().decode()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if (
                sample.name == "vllm:request_success_total"
                and sample.labels["finished_reason"] == "abort"
            ):
                return sample.value
    raise AssertionError("no abort sample")


async def _open_stream_and_leave(url: str, body: dict[str, object], chunks: int) -> None:
    """Read ``chunks`` SSE lines of a stream, then close the connection mid-stream."""
    async with aiohttp.ClientSession() as session:
        resp = await session.post(url, json={**body, "stream": True})
        for _ in range(chunks):
            await resp.content.readline()
        resp.close()


async def test_stream_disconnect_aborts_within_a_second(emulator: LiveEmulator) -> None:
    """Closing a stream mid-way aborts the request: aborted_total +1, the abort metric +1,
    and nothing left running or holding KV within 1 s."""
    before = _abort_count(emulator)
    await _open_stream_and_leave(emulator.base_url + "/v1/completions", LONG, chunks=6)
    assert await asyncio.to_thread(
        emulator.wait_for,
        lambda s: s["aborted_total"] == 1 and s["running"] == 0 and s["kv_cache_usage"] == 0,
        1.0,
    )
    assert emulator.stats()["finished_total"] == 0
    assert _abort_count(emulator) == before + 1


async def test_non_streaming_disconnect_aborts(emulator: LiveEmulator) -> None:
    """A non-streaming client that gives up while waiting aborts its request."""
    async with aiohttp.ClientSession() as session:
        with pytest.raises(asyncio.TimeoutError):
            async with asyncio.timeout(0.2):
                await session.post(emulator.base_url + "/v1/completions", json=LONG)
    assert await asyncio.to_thread(
        emulator.wait_for, lambda s: s["aborted_total"] == 1 and s["running"] == 0, 1.0
    )


async def test_disconnect_while_queued_leaves_the_queue(
    tiny: EngineConfig, start_emulator: Callable[..., AbstractContextManager[LiveEmulator]]
) -> None:
    """A stream that leaves while still waiting for a slot is removed from the queue."""
    with start_emulator(dataclasses.replace(tiny, max_num_seqs=1)) as live:
        url = live.base_url + "/v1/chat/completions"
        chat = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}
        body = {**chat, "max_tokens": 5000, "ignore_eos": True}
        async with aiohttp.ClientSession() as session:
            first = await session.post(url, json={**body, "stream": True})
            await first.content.readline()
            second = await session.post(url, json={**body, "stream": True})
            assert await asyncio.to_thread(live.wait_for, lambda s: s["waiting"] == 1, 1.0)
            second.close()
            assert await asyncio.to_thread(
                live.wait_for, lambda s: s["waiting"] == 0 and s["aborted_total"] == 1, 1.0
            )
            assert live.stats()["running"] == 1
            first.close()
