"""Overload: full queues, queue timeouts and rate limits answer with retry headers, and the
caps hold under a burst."""

from __future__ import annotations

import asyncio
import time

import aiohttp
import httpx2
import openai

from tests.gateway.gateway_harness import (
    ADMIN_KEY,
    FAST_PRIORS,
    MODEL,
    assert_retry_headers,
    engine_stats,
    http_call,
    model_state,
    open_stream,
    openai_error,
    stack,
    wait_until,
)
from tests.gateway.small_requests import SMALL, post_small, queue_behind_stream

ONE_SLOT = f"""    max_concurrency: 1
{FAST_PRIORS}    lanes:
      - {{name: interactive, max_concurrency: 1, max_queue: 0}}
"""
# Priors near the emulator's real pace (~2 ms per token), so wait estimates are honest.
ONE_SLOT_PACED = """    max_concurrency: 1
    prior_output_tokens: 300
    prior_decode_tokens_per_s: 500.0
    lanes:
      - {name: interactive, max_concurrency: 1, max_queue: 0}
"""
SHORT_TIMEOUT = f"""    max_concurrency: 1
{FAST_PRIORS}    lanes:
      - {{name: interactive, max_concurrency: 1, max_queue: 4, queue_timeout_s: 0.3}}
"""
RATE_LIMITED = """tenants:
  - {name: a, api_key_env: KEY_A, requests_per_s: 1, burst_requests: 1}
"""
TWO_PER_S = """tenants:
  - {name: a, api_key_env: KEY_A, requests_per_s: 2, burst_requests: 1}
"""
BURST_CAP = 4
BURST = """    max_concurrency: 4
"""


async def test_full_queue_is_429_queue_full_with_retry_headers() -> None:
    """With every slot busy and ``max_queue: 0`` a request is refused at once with 429
    ``queue_full``, ``Retry-After`` (whole seconds ≥ 1) and ``retry-after-ms``."""
    with stack(ONE_SLOT) as gateway:
        async with aiohttp.ClientSession() as session:
            holder = await open_stream(session, gateway.base_url)
            reply = await asyncio.to_thread(
                http_call, gateway.base_url, "POST", "/v1/completions", json=SMALL
            )
            holder.close()
    assert reply.status == 429
    error = openai_error(reply)
    assert (error["type"], error["code"]) == ("rate_limit_error", "queue_full")
    assert_retry_headers(reply)


async def test_sdk_retry_honours_retry_after_and_succeeds_when_a_slot_frees() -> None:
    """The openai SDK (max_retries=3) waits out each ``queue_full`` 429 as its
    ``retry-after-ms`` says (the gateway's estimate of the running request's remaining
    time) and succeeds once that request has finished and freed the slot."""
    seen: list[httpx2.Response] = []

    async def _record(response: httpx2.Response) -> None:
        seen.append(response)

    with stack(ONE_SLOT_PACED) as gateway:
        async with (
            aiohttp.ClientSession() as session,
            httpx2.AsyncClient(event_hooks={"response": [_record]}) as http,
            openai.AsyncOpenAI(
                base_url=gateway.base_url + "/v1",
                api_key="unused",
                max_retries=3,
                timeout=20,
                http_client=http,
            ) as sdk,
        ):
            # ~300 steps of ~2 ms, as the priors predict.
            holder = await open_stream(session, gateway.base_url, max_tokens=300)
            start = time.monotonic()
            raw = await sdk.completions.with_raw_response.create(
                model=MODEL, prompt="retry me", max_tokens=4, extra_body={"ignore_eos": True}
            )
            elapsed = time.monotonic() - start
            await holder.read()
            holder.close()
    assert raw.retries_taken >= 1
    refusals = [int(r.headers["retry-after-ms"]) for r in seen if r.status_code == 429]
    assert len(refusals) == raw.retries_taken
    assert elapsed >= sum(refusals) / 1000.0  # waited out retry-after-ms, not its own backoff
    completion = raw.parse()
    assert completion.usage is not None
    assert completion.usage.completion_tokens == 4


async def test_queue_timeout_is_503_with_retry_headers() -> None:
    """A request still queued after the lane's ``queue_timeout_s`` gets 503 ``queue_timeout``
    with retry headers, no earlier than the timeout."""
    with stack(SHORT_TIMEOUT) as gateway:
        async with aiohttp.ClientSession() as session:
            holder = await open_stream(session, gateway.base_url)
            elapsed, reply = await asyncio.to_thread(post_small, gateway)
            holder.close()
    assert reply.status == 503
    error = openai_error(reply)
    assert (error["type"], error["code"]) == ("service_unavailable_error", "queue_timeout")
    assert_retry_headers(reply)
    assert 0.28 <= elapsed < 2.0


async def test_queued_request_reports_its_wait_in_queue_ms() -> None:
    """A request that queued behind a running one reports (at least) the time it waited in
    ``X-Sluicegate-Queue-Ms`` once it is admitted."""
    with stack(SHORT_TIMEOUT.replace("0.3}", "5.0}")) as gateway:
        async with aiohttp.ClientSession() as session:
            holder, waiting, queued = await queue_behind_stream(session, gateway, post_small)
            await asyncio.sleep(0.2)
            holder.close()
            _, reply = await waiting
    assert queued
    assert reply.status == 200
    assert float(reply.headers["x-sluicegate-queue-ms"]) >= 190.0


def test_rate_limit_is_429_with_retry_headers() -> None:
    """A tenant over ``requests_per_s`` (burst 1) gets 429 ``rate_limit_exceeded`` with
    ``Retry-After``; the request within the burst was served."""
    with stack(RATE_LIMITED, environ={"KEY_A": "sk-rate"}) as gateway:
        _, first = post_small(gateway, "sk-rate")
        _, second = post_small(gateway, "sk-rate")
    assert first.status == 200
    assert second.status == 429
    error = openai_error(second)
    assert (error["type"], error["code"]) == ("rate_limit_error", "rate_limit_exceeded")
    assert_retry_headers(second)


def test_rate_limit_retry_after_ms_is_the_precise_refill_time() -> None:
    """A tenant limited to 2 req/s (burst 1) that asks again at once is told the bucket's
    real refill time in ``retry-after-ms``: under 500 ms and no less than the time left,
    not a floor of 1,000 ms; ``Retry-After`` stays whole seconds, 1."""
    with stack(TWO_PER_S, environ={"KEY_A": "sk-rate"}) as gateway:
        start = time.monotonic()
        _, first = post_small(gateway, "sk-rate")
        _, second = post_small(gateway, "sk-rate")
        spent_ms = 1000.0 * (time.monotonic() - start)
        millis = int(second.headers["retry-after-ms"])
        time.sleep(millis / 1000.0)
        _, third = post_small(gateway, "sk-rate")
    assert (first.status, second.status) == (200, 429)
    assert 500.0 - spent_ms <= millis <= 500, (millis, spent_ms)
    assert second.headers["retry-after"] == "1"
    assert third.status == 200  # the precise wait was long enough


async def _stream_tokens(sdk: openai.AsyncOpenAI, tokens: int) -> int:
    """Stream one ``ignore_eos`` completion to its end; how many text chunks arrived."""
    stream = await sdk.completions.create(
        model=MODEL, prompt="burst", max_tokens=tokens, stream=True,
        extra_body={"ignore_eos": True},
    )  # fmt: skip
    async with stream:
        return len([chunk async for chunk in stream if chunk.choices and chunk.choices[0].text])


async def _watch_running(base_url: str, stop: asyncio.Event) -> list[int]:
    """Sample the gateway's running count for the model until ``stop`` is set."""
    samples: list[int] = []
    async with aiohttp.ClientSession() as session:
        headers = {"Authorization": f"Bearer {ADMIN_KEY}"}
        while not stop.is_set():
            async with session.get(base_url + "/admin/state", headers=headers) as response:
                state = await response.json()
            model = next(m for m in state["models"] if m["name"] == MODEL)
            samples.append(model["running"])
            samples.extend(lane["running"] for lane in model["lanes"])
            await asyncio.sleep(0.003)
    return samples


async def test_burst_of_40_streams_never_exceeds_the_model_cap() -> None:
    """40 concurrent streams through a model capped at 4 in front of two engines: the
    gateway never shows more than 4 running, no engine ever runs more than 4, every stream
    completes in full, and afterwards nothing is running or queued anywhere."""
    with stack(BURST, engines=2) as gateway:
        stop = asyncio.Event()
        watcher = asyncio.ensure_future(_watch_running(gateway.base_url, stop))
        async with openai.AsyncOpenAI(
            base_url=gateway.base_url + "/v1", api_key="unused", max_retries=0, timeout=30
        ) as sdk:
            counts = await asyncio.gather(*(_stream_tokens(sdk, 20) for _ in range(40)))
        stop.set()
        samples = await watcher
        state = model_state(gateway.base_url)
        engines = [gateway.engine_url(i) for i in range(2)]
        settled = await asyncio.to_thread(
            wait_until, lambda: all(engine_stats(url)["running"] == 0 for url in engines), 1.0
        )
        stats = [engine_stats(url) for url in engines]
    assert counts == [20] * 40
    assert max(samples) == BURST_CAP  # the cap was reached, and never passed
    assert all(s["max_running_seen"] <= BURST_CAP for s in stats)
    assert sum(s["admitted_total"] for s in stats) == 40
    assert (state["running"], state["queued"]) == (0, 0)
    assert all((lane["running"], lane["queued"]) == (0, 0) for lane in state["lanes"])
    assert settled
