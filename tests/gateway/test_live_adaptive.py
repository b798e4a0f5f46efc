"""Adaptive concurrency limits over real HTTP (DESIGN §5): the effective cap follows the
engine's KV-cache pressure (``kv_cache`` mode) or its time to first token (``latency``)."""

from __future__ import annotations

import asyncio

import aiohttp
from gateway_harness import (
    FAST_PRIORS,
    MODEL,
    Stack,
    engine_config,
    metric,
    model_state,
    open_stream,
    read_events,
    stack,
    wait_until,
)

CAP = 8
KV = f"""    max_concurrency: {CAP}
    adaptive: {{mode: kv_cache, floor: 1, high_water: 0.5, low_water: 0.2}}
{FAST_PRIORS}    lanes:
      - {{name: interactive, max_concurrency: {CAP}}}
server: {{scrape_interval_s: 0.2}}
"""
LATENCY = f"""    max_concurrency: {CAP}
    adaptive: {{mode: latency, floor: 1}}
{FAST_PRIORS}    lanes:
      - {{name: interactive, max_concurrency: {CAP}}}
"""
# 8,192 tokens of KV; three streams with 1,500-token prompts fill more than half of it.
SMALL_KV = engine_config(kv_capacity_tokens=8192, max_num_seqs=8)
LONG_PROMPT = "x" * 6000


def _cap(gateway: Stack) -> int:
    return int(model_state(gateway.base_url)["cap"])


def _limit_metric(gateway: Stack) -> float | None:
    return metric(gateway.base_url, "sluicegate_concurrency_limit", model=MODEL, lane="interactive")


async def test_kv_pressure_lowers_the_limit_and_draining_restores_it() -> None:
    """``kv_cache`` mode with ``high_water: 0.5``: while long prompts hold more than half of
    the engine's KV cache, the model's effective cap falls below the configured 8 and
    ``sluicegate_concurrency_limit`` reports the lowered value; once the requests end and the
    cache drains below ``low_water``, the cap climbs back to 8."""
    with stack(KV, engine=SMALL_KV) as gateway:
        async with aiohttp.ClientSession() as session:
            streams = [
                await open_stream(session, gateway.base_url, max_tokens=1000, prompt=LONG_PROMPT)
                for _ in range(3)
            ]
            lowered = await asyncio.to_thread(wait_until, lambda: _cap(gateway) <= CAP - 2, 3.0)
            state = model_state(gateway.base_url)
            reported = _limit_metric(gateway)
            for stream in streams:
                stream.close()
        recovered = await asyncio.to_thread(wait_until, lambda: _cap(gateway) == CAP, 4.0)
        reported_after = _limit_metric(gateway)
    assert lowered, "the cap did not fall under KV pressure"
    assert state["configured_cap"] == CAP
    assert state["backends"][0]["kv_cache_usage"] > 0.5
    assert reported == state["cap"] < CAP
    assert recovered, "the cap did not recover once the KV cache drained"
    assert reported_after == CAP


async def test_lowered_limit_makes_new_requests_wait() -> None:
    """When KV pressure has pulled the effective cap down to its floor (3, the number
    running), a new request is queued rather than admitted, and runs once a running request
    ends."""
    with stack(KV.replace("floor: 1", "floor: 3"), engine=SMALL_KV) as gateway:
        async with aiohttp.ClientSession() as session:
            streams = [
                await open_stream(session, gateway.base_url, max_tokens=1000, prompt=LONG_PROMPT)
                for _ in range(3)
            ]
            at_floor = await asyncio.to_thread(wait_until, lambda: _cap(gateway) == 3, 3.0)
            body = {"model": MODEL, "prompt": "later", "max_tokens": 2, "ignore_eos": True}
            late = asyncio.ensure_future(
                session.post(gateway.base_url + "/v1/completions", json=body)
            )
            queued = await asyncio.to_thread(
                wait_until, lambda: model_state(gateway.base_url)["queued"] == 1, 1.0
            )
            streams[0].close()
            async with await asyncio.wait_for(late, 5.0) as reply:
                status = reply.status
            for stream in streams[1:]:
                stream.close()
    assert at_floor
    assert queued
    assert status == 200


async def _stream(session: aiohttp.ClientSession, gateway: Stack, tokens: int) -> None:
    body = {
        "model": MODEL, "prompt": "ttft", "max_tokens": tokens, "ignore_eos": True,
        "stream": True,
    }  # fmt: skip
    async with session.post(gateway.base_url + "/v1/completions", json=body) as reply:
        assert reply.status == 200
        events = await read_events(reply)
        assert events[-1] == b"[DONE]"


async def test_rising_time_to_first_token_lowers_the_latency_limit() -> None:
    """``latency`` mode (Gradient2 on TTFT): after quick requests on an idle engine set the
    long-run TTFT, eight concurrent streams on an engine that runs only two at a time make
    the later ones wait inside the engine; their TTFT far above the long-run level lowers
    the model's effective cap below the configured 8."""
    with stack(LATENCY, engine=engine_config(max_num_seqs=2)) as gateway:
        async with aiohttp.ClientSession() as session:
            for _ in range(5):
                await _stream(session, gateway, 5)
            warm_cap = _cap(gateway)
            await asyncio.gather(*(_stream(session, gateway, 150) for _ in range(CAP)))
        cap = _cap(gateway)
        reported = _limit_metric(gateway)
    assert warm_cap == CAP
    assert cap < CAP
    assert reported == cap
