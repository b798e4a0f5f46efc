"""The gateway's live behaviours, once per engine the emulator plays (``--personality``):
the gateway reads each through that engine's profile, so each must give what the
behaviour needs — KV usage for ``adaptive: kv_cache``, KV capacity for
``max_inflight_tokens: auto``, the engine's own queue for ``least_expected_time``, an
abort in the engine for a preempted request, and its refusals in OpenAI's shape.

``READS`` says, per personality, what its engine reports (llama-server reports neither
KV usage nor capacity: a slot holds its context for the whole request); a personality
missing from it fails every test here until someone says what it reports.
"""

from __future__ import annotations

import asyncio

import aiohttp
import pytest

from sluicegate.core.spec import KV_WATERMARK
from sluicegate.emulator.personalities import PERSONALITIES
from sluicegate.engine import preset
from tests.gateway.gateway_harness import (
    FAST_PRIORS,
    MODEL,
    Stack,
    backend_state,
    engine_config,
    engine_stats,
    model_state,
    open_stream,
    read_events,
    stack,
    wait_until,
)

READS = {  # personality: (KV usage, KV capacity)
    "vllm": (True, True),
    "sglang": (True, True),
    "tgi": (True, True),
    "trtllm": (True, True),
    "llama-server": (False, False),
}
PERSONAS = sorted(PERSONALITIES)
CAP = 8
SCRAPE = "server: {scrape_interval_s: 0.1}\n"
KV = f"""    max_concurrency: {CAP}
    adaptive: {{mode: kv_cache, floor: 1, high_water: 0.5, low_water: 0.2}}
{FAST_PRIORS}    lanes:
      - {{name: interactive, max_concurrency: {CAP}}}
{SCRAPE}"""
SMALL_KV = engine_config(kv_capacity_tokens=8192, max_num_seqs=8)
LONG_PROMPT = "x" * 6000
BEST_EFFORT = {"X-Sluicegate-Lane": "best_effort", "X-Sluicegate-Priority": "4"}
PREEMPT = f"""    max_concurrency: 1
{FAST_PRIORS}    lanes:
      - {{name: interactive, max_concurrency: 1, preemptible: never, preempt_after_ms: 100}}
      - {{name: best_effort, max_concurrency: 1, preemptible: always, preempt_action: abort,
          policy: fifo}}
"""


def _cap(gateway: Stack) -> int:
    return int(model_state(gateway.base_url)["cap"])


@pytest.mark.parametrize("persona", PERSONAS)
async def test_kv_pressure_moves_the_limit_where_the_engine_reports_it(persona: str) -> None:
    """Three long prompts hold over half the KV cache: an engine that reports KV usage pulls
    the ``kv_cache`` limit below 8; one that does not leaves it at 8 with no usage read."""
    reports_kv, _ = READS[persona]
    with stack(KV, engine=SMALL_KV, persona=persona) as gateway:
        async with aiohttp.ClientSession() as session:
            streams = [
                await open_stream(session, gateway.base_url, max_tokens=1000, prompt=LONG_PROMPT)
                for _ in range(3)
            ]
            lowered = await asyncio.to_thread(wait_until, lambda: _cap(gateway) < CAP, 3.0)
            usage = backend_state(gateway.base_url, "e0")["kv_cache_usage"]
            for stream in streams:
                stream.close()
    assert lowered is reports_kv
    if reports_kv:
        assert usage > 0.5
    else:
        assert usage is None


@pytest.mark.parametrize("persona", PERSONAS)
async def test_auto_token_budget_comes_from_the_engines_capacity(persona: str) -> None:
    """``max_inflight_tokens: auto`` (the default) becomes 0.9 × the engine's KV capacity
    once scraped, where the engine reports one; otherwise there is no budget."""
    _, reports_capacity = READS[persona]
    tiny = preset("tiny")
    expected = int(tiny.num_blocks * tiny.block_size * KV_WATERMARK) if reports_capacity else None
    with stack(SCRAPE, persona=persona) as gateway:
        scraped = await asyncio.to_thread(
            wait_until,
            lambda: backend_state(gateway.base_url, "e0")["metrics_age_s"] is not None,
            3.0,
        )
        settled = await asyncio.to_thread(
            wait_until,
            lambda: model_state(gateway.base_url)["max_inflight_tokens"] == expected,
            2.0,
        )
    assert scraped
    assert settled, model_state(gateway.base_url)["max_inflight_tokens"]


@pytest.mark.parametrize("persona", PERSONAS)
async def test_least_expected_time_routes_around_the_engine_with_a_queue(persona: str) -> None:
    """Four streams sent straight to engine 0 (two slots) leave two in its own queue; the
    gateway reads that queue through the profile and sends its next ten requests to e1."""
    body = f"""    max_concurrency: 32
    router: least_expected_time
{FAST_PRIORS}    lanes:
      - {{name: interactive, max_concurrency: 32}}
{SCRAPE}"""
    two_seqs = engine_config(max_num_seqs=2)
    with stack(body, engines=2, engine=two_seqs, persona=persona) as gateway:
        async with aiohttp.ClientSession() as session:
            direct = [await open_stream(session, gateway.engine_url(0), events=0) for _ in range(4)]
            queued = await asyncio.to_thread(
                wait_until,
                lambda: (backend_state(gateway.base_url, "e0")["num_requests_waiting"] or 0) > 0,
                3.0,
            )
            before = engine_stats(gateway.engine_url(1))["admitted_total"]
            small = {"model": MODEL, "prompt": "route me", "max_tokens": 2, "ignore_eos": True}
            for _ in range(10):
                async with session.post(gateway.base_url + "/v1/completions", json=small) as r:
                    assert r.status == 200, await r.text()
            after = engine_stats(gateway.engine_url(1))["admitted_total"]
            for stream in direct:
                stream.close()
    assert queued
    assert after - before == 10


@pytest.mark.parametrize("persona", PERSONAS)
async def test_a_preempted_stream_is_aborted_in_the_engine(persona: str) -> None:
    """A best-effort stream holds the one slot; an interactive request turns urgent and
    preempts it: the client gets ``preempted`` and the engine aborts the sequence."""
    with stack(PREEMPT, persona=persona) as gateway:
        async with aiohttp.ClientSession() as session:
            victim = await open_stream(session, gateway.base_url, events=2, headers=BEST_EFFORT)
            reader = asyncio.ensure_future(read_events(victim))
            body = {"model": MODEL, "prompt": "urgent", "max_tokens": 3, "ignore_eos": True}
            async with session.post(gateway.base_url + "/v1/completions", json=body) as reply:
                status = reply.status
                await reply.read()
            events = await asyncio.wait_for(reader, 5.0)
            victim.close()
            aborted = await asyncio.to_thread(
                wait_until, lambda: engine_stats(gateway.engine_url())["aborted_total"] >= 1, 2.0
            )
    assert status == 200
    assert events[-1] == b"[DONE]"
    assert b'"finish_reason":"preempted"' in events[-2]
    assert aborted


@pytest.mark.parametrize("persona", PERSONAS)
async def test_a_refusal_reaches_the_client_in_openais_shape(persona: str) -> None:
    """A prompt past the engine's context: the engine refuses in its own shape, the client
    gets a 4xx whose body is OpenAI's error shape with a string code naming the cause."""
    tiny = preset("tiny")
    prompt = "x" * (tiny.num_blocks * tiny.block_size * 5)
    with stack("", persona=persona) as gateway:
        body = {"model": MODEL, "prompt": prompt, "max_tokens": 4}
        async with (
            aiohttp.ClientSession() as session,
            session.post(gateway.base_url + "/v1/completions", json=body) as reply,
        ):
            status = reply.status
            answer = await reply.json()
    assert status in (400, 422), answer
    error = answer["error"]
    assert set(error) >= {"message", "type", "code", "param"}
    assert error["code"] == "context_length_exceeded", error
    assert error["message"]
