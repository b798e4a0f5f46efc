"""Lane borrowing over real HTTP (DESIGN §5): idle capacity is lent, and reclaimed on demand.

The model's cap (4) is the sum of its two lanes' caps (2 + 2), so the batch
lane can only run more than its own 2 by borrowing the interactive lane's
idle quota.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import aiohttp
import openai

from tests.gateway.gateway_harness import (
    FAST_PRIORS,
    MODEL,
    Stack,
    engine_stats,
    finish_reason,
    lane_state,
    model_state,
    open_stream,
    read_events,
    stack,
    wait_until,
)

BATCH = {"X-Sluicegate-Lane": "batch"}


def _config(*, borrow: bool = True, lend: bool = True) -> str:
    return f"""    max_concurrency: 4
{FAST_PRIORS}    lanes:
      - {{name: interactive, max_concurrency: 2, preemptible: never, lend: {str(lend).lower()}}}
      - {{name: batch, max_concurrency: 2, preemptible: always, borrow: {str(borrow).lower()},
          policy: fifo}}
"""


@asynccontextmanager
async def _batch_streams(
    session: aiohttp.ClientSession, gateway: Stack, count: int
) -> AsyncIterator[list[asyncio.Task[aiohttp.ClientResponse]]]:
    """Send ``count`` long batch streams (admitted or queued); close them all on exit."""
    body = {
        "model": MODEL, "prompt": "batch", "max_tokens": 5000, "ignore_eos": True,
        "stream": True,
    }  # fmt: skip
    url = gateway.base_url + "/v1/completions"
    tasks = [
        asyncio.ensure_future(session.post(url, json=body, headers=BATCH)) for _ in range(count)
    ]
    try:
        yield tasks
    finally:
        for task in tasks:
            task.cancel()
        for response in await asyncio.gather(*tasks, return_exceptions=True):
            if isinstance(response, aiohttp.ClientResponse):
                response.close()


async def _settles(gateway: Stack, lane: str, running: int, queued: int) -> bool:
    """Whether ``lane`` shows ``running`` and ``queued`` within 2 s."""

    def check() -> bool:
        state = lane_state(gateway.base_url, lane)
        return (state["running"], state["queued"]) == (running, queued)

    return await asyncio.to_thread(wait_until, check, 2.0)


async def test_batch_borrows_the_idle_interactive_capacity() -> None:
    """With the interactive lane idle, four batch streams all run although the batch lane's
    own cap is 2: ``/admin/state`` shows 2 of them borrowed, and the engine runs 4."""
    with stack(_config()) as gateway:
        async with aiohttp.ClientSession() as session, _batch_streams(session, gateway, 4):
            settled = await _settles(gateway, "batch", running=4, queued=0)
            batch = lane_state(gateway.base_url, "batch")
            engine_runs_4 = await asyncio.to_thread(
                wait_until, lambda: engine_stats(gateway.engine_url())["running"] == 4, 2.0
            )
    assert settled
    assert batch["borrowed"] == 2
    assert engine_runs_4


async def test_interactive_reclaims_lent_capacity_by_preempting_a_borrower() -> None:
    """While batch streams borrow the interactive lane's quota, an interactive request arrives:
    one borrowed stream ends with ``finish_reason: "preempted"`` and the interactive request
    is admitted at once (no urgency wait), its queue time well under 100 ms."""
    with stack(_config()) as gateway:
        async with aiohttp.ClientSession() as session:
            streams = [
                await open_stream(session, gateway.base_url, headers=BATCH) for _ in range(4)
            ]
            borrowed = lane_state(gateway.base_url, "batch")["borrowed"]
            readers = [asyncio.ensure_future(read_events(s)) for s in streams]
            async with openai.AsyncOpenAI(
                base_url=gateway.base_url + "/v1", api_key="unused", max_retries=0
            ) as sdk:
                raw = await sdk.completions.with_raw_response.create(
                    model=MODEL, prompt="mine", max_tokens=5, extra_body={"ignore_eos": True}
                )
            done, pending = await asyncio.wait(
                readers, timeout=2.0, return_when=asyncio.FIRST_COMPLETED
            )
            more, _ = await asyncio.wait(pending, timeout=0.3)
            for stream in streams:
                stream.close()
            await asyncio.gather(*readers, return_exceptions=True)
    assert borrowed == 2
    assert (len(done), len(more)) == (1, 0), "exactly one borrower is reclaimed"
    events = next(iter(done)).result()
    assert finish_reason(events[-2]) == "preempted"
    assert events[-1] == b"[DONE]"
    assert float(raw.headers["x-sluicegate-queue-ms"]) < 100.0
    usage = raw.parse().usage
    assert usage is not None
    assert usage.completion_tokens == 5  # served in full: all of max_tokens (ignore_eos)


async def test_lane_that_may_not_borrow_stays_within_its_cap() -> None:
    """With ``borrow: false`` and the interactive lane idle, four batch streams run two at a
    time: two run, two wait in the batch queue, nothing is borrowed, the engine runs 2."""
    with stack(_config(borrow=False)) as gateway:
        async with aiohttp.ClientSession() as session, _batch_streams(session, gateway, 4):
            settled = await _settles(gateway, "batch", running=2, queued=2)
            await asyncio.sleep(0.2)  # a late borrow would show by now
            batch = lane_state(gateway.base_url, "batch")
            engine = engine_stats(gateway.engine_url())
    assert settled
    assert (batch["running"], batch["queued"], batch["borrowed"]) == (2, 2, 0)
    assert engine["running"] == 2


async def test_lane_that_does_not_lend_keeps_its_capacity_reserved() -> None:
    """With ``lend: false`` on the idle interactive lane, batch (``borrow: true``) runs only its
    own two streams; an interactive request is then admitted at once without preempting
    anything."""
    with stack(_config(lend=False)) as gateway:
        async with aiohttp.ClientSession() as session, _batch_streams(session, gateway, 4):
            settled = await _settles(gateway, "batch", running=2, queued=2)
            await asyncio.sleep(0.2)
            batch = lane_state(gateway.base_url, "batch")
            async with openai.AsyncOpenAI(
                base_url=gateway.base_url + "/v1", api_key="unused", max_retries=0
            ) as sdk:
                raw = await sdk.completions.with_raw_response.create(
                    model=MODEL, prompt="mine", max_tokens=5, extra_body={"ignore_eos": True}
                )
            state = model_state(gateway.base_url)
            engine = engine_stats(gateway.engine_url())
    assert settled
    assert batch["borrowed"] == 0
    assert float(raw.headers["x-sluicegate-queue-ms"]) < 50.0
    assert engine["aborted_total"] == 0
    assert state["running"] == 2
