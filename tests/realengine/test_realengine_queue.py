"""llama.cpp serves one request at a time; with the backend's ``max_concurrency: 1`` the
gateway holds the rest in its own queue and sends them one by one in policy order, each
answered in full."""

from __future__ import annotations

import asyncio
import time

import aiohttp
import openai
import pytest

from tests.gateway.gateway_harness import MODEL, Stack, http_call, model_state, wait_until
from tests.realengine.llama_server import require_llama_cpp
from tests.realengine.realengine_client import completion_body
from tests.realengine.realengine_stack import GatewayFactory, held_with_a_waiter, hold_engine

require_llama_cpp()
pytestmark = pytest.mark.realengine

BY_PRIORITY = """    lanes:
      - {name: interactive, policy: priority, preemptible: never, max_queue: 16}
"""
# Sent in this order while the engine is busy; served most important (lowest) first.
PRIORITIES = (5, 3, 0, 4)
SMALL_TOKENS = 8


def _queued(gateway: Stack, count: int) -> bool:
    return wait_until(lambda: model_state(gateway.base_url)["queued"] == count, 5.0)


async def test_queued_requests_are_served_one_at_a_time_in_priority_order(
    gateway_for: GatewayFactory,
) -> None:
    """While one stream holds the engine, four requests queue in the gateway (the engine
    sees only one); released, they are answered one after another, most important first,
    every one in full."""
    finished: list[tuple[float, int, openai.types.Completion]] = []
    with gateway_for(BY_PRIORITY, scrape=False) as gateway:
        client = openai.AsyncOpenAI(
            base_url=gateway.base_url + "/v1", api_key="unused", max_retries=0
        )
        async with aiohttp.ClientSession() as session, client:

            async def ask(priority: int) -> None:
                answer = await client.completions.create(
                    model=MODEL, prompt=f"priority {priority}", max_tokens=SMALL_TOKENS,
                    temperature=0.0, extra_headers={"X-Sluicegate-Priority": str(priority)},
                )  # fmt: skip
                finished.append((time.monotonic(), priority, answer))

            holder = await hold_engine(session, gateway)
            tasks = []
            for i, priority in enumerate(PRIORITIES):
                tasks.append(asyncio.ensure_future(ask(priority)))
                assert await asyncio.to_thread(_queued, gateway, i + 1)
            state = model_state(gateway.base_url)
            holder.close()
            await asyncio.wait_for(asyncio.gather(*tasks), 30)
    assert (state["running"], state["queued"]) == (1, len(PRIORITIES))
    assert [priority for _, priority, _ in sorted(finished)] == sorted(PRIORITIES)
    for _, _, answer in finished:
        assert answer.choices[0].finish_reason == "length"
        assert answer.usage is not None
        assert answer.usage.completion_tokens == SMALL_TOKENS


# A queue of one, and a prior of 4 s per request (64 tokens at 16 tokens/s).
ONE_WAITING = """    prior_output_tokens: 64
    prior_decode_tokens_per_s: 16.0
    lanes:
      - {name: interactive, policy: fifo, preemptible: never, max_queue: 1}
"""
PRIOR_SERVICE_S = 4.0


async def test_retry_after_counts_the_engines_single_slot(gateway_for: GatewayFactory) -> None:
    """One request runs and one waits: a third, refused with 429, is told to retry after at
    least the predicted service of the one waiting, since the engine serves one at a time."""
    with gateway_for(ONE_WAITING, scrape=False) as gateway:
        async with held_with_a_waiter(gateway, "wait", 4) as (holder, waiting):
            assert await asyncio.to_thread(_queued, gateway, 1)
            refused = await asyncio.to_thread(
                http_call, gateway.base_url, "POST", "/v1/completions",
                json=completion_body("refused", 4),
            )  # fmt: skip
            holder.close()
            await asyncio.wait_for(waiting, 30)
    assert refused.status == 429
    assert int(refused.headers["retry-after"]) >= PRIOR_SERVICE_S
