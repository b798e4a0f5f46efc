"""Adaptive concurrency limits over real HTTP (DESIGN §5): the effective cap follows the
engine's KV-cache pressure (``kv_cache`` mode), its latency (``latency``), or its failures
and refusals (``aimd``), for streamed and non-streamed traffic alike.

Engines are real servers on loopback: the emulator (``sluicegate emulate``) and, for
failures, ``faulty_engine.FaultyEngine`` from the hardening tests."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest

from tests.gateway.gateway_harness import (
    FAST_PRIORS,
    MODEL,
    Stack,
    engine_config,
    gateway_at,
    metric,
    model_state,
    open_stream,
    read_events,
    stack,
    wait_until,
)
from tests.hardening.faulty_engine import Fault, faulty_engine

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


# ------------------------------------------------------------------ non-streamed traffic


async def _unary(
    session: aiohttp.ClientSession,
    gateway: Stack,
    tokens: int,
    *,
    prompt: str | list[str] = "unary",
    **extra: object,
) -> int:
    """One non-streamed ``ignore_eos`` completion through the gateway; its status."""
    body = {"model": MODEL, "prompt": prompt, "max_tokens": tokens, "ignore_eos": True, **extra}
    async with session.post(gateway.base_url + "/v1/completions", json=body) as reply:
        await reply.read()
        return reply.status


# The lane never preempts, so unary requests reach the engine unstreamed and whole.
AIMD = f"""    max_concurrency: {CAP}
    adaptive: {{mode: aimd, floor: 1}}
    circuit_failures: 1000
{FAST_PRIORS}    lanes:
      - {{name: interactive, max_concurrency: {CAP}, preemptible: never}}
server: {{upstream_first_byte_timeout_s: 0.3}}
"""


async def test_aimd_falls_on_engine_refusals_failures_and_timeouts_then_recovers() -> None:
    """``aimd`` on non-streamed traffic: each of the engine's 429s, 500s and a first-byte
    timeout is a drop that takes the cap down one step (8 → 7 → 6 → 5 → 4 → 3 with the
    default decrease of 0.9), and ``sluicegate_concurrency_limit`` follows; once the engine
    answers again, bursts of successes grow it back to 8."""
    caps: list[int] = []
    statuses: list[int] = []
    with faulty_engine() as engine, gateway_at([engine.port], AIMD, scrape=False) as gateway:
        async with aiohttp.ClientSession() as session:
            for fault in (Fault.RATE_LIMITED,) * 2 + (Fault.ERROR_500,) * 2:
                engine.fault = fault
                statuses.append(await _unary(session, gateway, 4))
                caps.append(_cap(gateway))
            engine.fault = Fault.HANG_BEFORE_HEADERS
            statuses.append(await _unary(session, gateway, 4))
            caps.append(_cap(gateway))
            lowered_metric = _limit_metric(gateway)
            engine.fault = Fault.NONE
            for _ in range(10):
                burst = await asyncio.gather(*(_unary(session, gateway, 4) for _ in range(CAP)))
                assert set(burst) == {200}
                if _cap(gateway) == CAP:
                    break
            recovered = _cap(gateway)
            recovered_metric = _limit_metric(gateway)
    assert statuses == [429, 429, 502, 502, 504]
    assert caps == [7, 6, 5, 4, 3]
    assert lowered_metric == 3
    assert recovered == CAP
    assert recovered_metric == CAP


async def test_client_mistakes_and_disconnects_do_not_lower_aimd() -> None:
    """``aimd``: the engine's 400 for a request it cannot serve (two prompts in one) and a
    client that leaves mid-answer say nothing about the engine's load; the cap stays at 8.
    (The 0.3 s first-byte timeout the other aimd tests need would make a slow first answer on a busy
    machine a timeout, which is a drop.)"""
    with stack(
        AIMD.replace("upstream_first_byte_timeout_s: 0.3", "upstream_first_byte_timeout_s: 10")
    ) as gateway:
        async with aiohttp.ClientSession() as session:
            bad = [await _unary(session, gateway, 4, prompt=["a", "b"]) for _ in range(3)]
            for _ in range(3):
                leaving = asyncio.ensure_future(_unary(session, gateway, 5000))
                running = await asyncio.to_thread(
                    wait_until, lambda: model_state(gateway.base_url)["running"] == 1, 3.0
                )
                assert running
                leaving.cancel()
                await asyncio.gather(leaving, return_exceptions=True)
                assert await asyncio.to_thread(
                    wait_until, lambda: model_state(gateway.base_url)["running"] == 0, 3.0
                )
            cap = _cap(gateway)
    assert bad == [400, 400, 400]
    assert cap == CAP


# Unary requests go to the engine whole (``preemptible: never``) or, when the lane may
# preempt them with ``abort`` (the default ``priority`` rule at priority 2), as a stream the
# gateway reassembles; their latency samples are time per output token or time to first token.
LATENCY_UNARY = {
    "whole": LATENCY.replace(
        f"{{name: interactive, max_concurrency: {CAP}}}",
        f"{{name: interactive, max_concurrency: {CAP}, preemptible: never}}",
    ),
    "streamed upstream": LATENCY,
}


@pytest.mark.parametrize("upstream", sorted(LATENCY_UNARY))
async def test_rising_unary_latency_lowers_the_latency_limit(upstream: str) -> None:
    """``latency`` mode on non-streamed traffic only: ten requests one at a time set the
    long-run level; then sixteen at once on an engine that runs one at a time wait inside the
    engine, so their latency (per output token when answered whole, to the first token when
    streamed upstream) rises far above it and the cap falls below 8."""
    config = LATENCY_UNARY[upstream]
    assert (upstream == "whole") == ("preemptible: never" in config)
    with stack(config, engine=engine_config(max_num_seqs=1)) as gateway:
        async with aiohttp.ClientSession() as session:
            for _ in range(10):
                assert await _unary(session, gateway, 40) == 200
            warm_cap = _cap(gateway)
            loaded = await asyncio.gather(*(_unary(session, gateway, 40) for _ in range(16)))
        cap = _cap(gateway)
        reported = _limit_metric(gateway)
    assert set(loaded) == {200}
    assert warm_cap == CAP
    assert cap < CAP
    assert reported == cap


async def test_kv_pressure_from_unary_requests_lowers_the_limit_and_recovers() -> None:
    """``kv_cache`` mode with non-streamed requests: three long-prompt requests hold more
    than half of the engine's KV cache while they run, which lowers the cap; they still
    answer 200, and once they are done the drained cache lets the cap climb back to 8."""
    with stack(KV, engine=SMALL_KV) as gateway:
        async with aiohttp.ClientSession() as session:
            requests = asyncio.gather(
                *(_unary(session, gateway, 600, prompt=LONG_PROMPT) for _ in range(3))
            )
            lowered = await asyncio.to_thread(wait_until, lambda: _cap(gateway) <= CAP - 2, 3.0)
            reported = _limit_metric(gateway)
            statuses = await requests
        recovered = await asyncio.to_thread(wait_until, lambda: _cap(gateway) == CAP, 4.0)
    assert lowered, "the cap did not fall under KV pressure"
    assert reported is not None
    assert reported <= CAP - 2
    assert statuses == [200, 200, 200]
    assert recovered, "the cap did not recover once the KV cache drained"
