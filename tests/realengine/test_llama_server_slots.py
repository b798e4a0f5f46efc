"""llama-server's slots behind the gateway: with the backend capped at ``--parallel`` nothing
waits in the engine's own queue while the gateway's queue orders the rest by policy; without
the cap the engine's queue fills; a client that leaves, or a preempted request, frees its
slot at once (measured from ``/slots``)."""

from __future__ import annotations

import asyncio
import statistics
import time
from typing import Any

import aiohttp
import openai
import pytest

from tests.gateway.gateway_harness import FAST_PRIORS, MODEL, Stack, model_state, wait_until
from tests.realengine.llama_cpp_server import LlamaCppServer, MetricsWatch, TaskEnd
from tests.realengine.realengine_stack import GatewayFactory

pytestmark = pytest.mark.realengine

SLOTS = 4  # the session server's --parallel
FILL, LOW, HIGH = SLOTS, 12, 4  # the burst: 20 requests
BURST_TOKENS = 400
HOLD_TOKENS = 1500  # a stream that holds its slot for seconds
FREED_WITHIN_S = 1.0
REPEATS = 5
BY_PRIORITY = """    max_concurrency: 32
    lanes:
      - {name: interactive, policy: priority, preemptible: never, max_concurrency: 32,
          max_queue: 64}
"""
URGENT_AFTER_MS = 100
PREEMPT = f"""    max_concurrency: {SLOTS}
{FAST_PRIORS}    lanes:
      - {{name: interactive, max_concurrency: {SLOTS}, preemptible: never,
          preempt_after_ms: {URGENT_AFTER_MS}}}
      - {{name: best_effort, max_concurrency: {SLOTS}, preemptible: always,
          preempt_action: abort, policy: fifo}}
"""
BEST_EFFORT = {"X-Sluicegate-Lane": "best_effort", "X-Sluicegate-Priority": "4"}


def _sdk(gateway: Stack) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(
        base_url=gateway.base_url + "/v1", api_key="unused", max_retries=0, timeout=60
    )


async def _started_at(sdk: openai.AsyncOpenAI, priority: int, prompt: str) -> float:
    """A non-streamed completion at ``priority``: when the gateway admitted it (monotonic
    submission time plus its ``X-Sluicegate-Queue-Ms``)."""
    submitted = time.monotonic()
    raw = await sdk.completions.with_raw_response.create(
        model=MODEL, prompt=prompt, max_tokens=BURST_TOKENS, temperature=0.0,
        extra_headers={"X-Sluicegate-Priority": str(priority)},
    )  # fmt: skip
    completion = raw.parse()
    assert completion.usage is not None
    assert completion.usage.completion_tokens == BURST_TOKENS
    return submitted + float(raw.headers["x-sluicegate-queue-ms"]) / 1000


async def _wait_state(gateway: Stack, key: str, count: int) -> None:
    reached = await asyncio.to_thread(
        wait_until, lambda: model_state(gateway.base_url)[key] == count, 10.0
    )
    assert reached, (key, count, model_state(gateway.base_url))


async def test_capped_at_the_slots_the_engine_never_queues_and_the_gateway_orders_by_priority(
    llama_cpp: LlamaCppServer, gateway_for_llama_cpp: GatewayFactory
) -> None:
    """Backend ``max_concurrency`` = ``--parallel`` (4), a burst of 20: 4 low-priority
    requests fill the slots, 12 more low-priority ones queue in the gateway, then 4
    high-priority ones arrive. Polled throughout, ``llamacpp:requests_deferred`` stays 0 and
    ``requests_processing`` reaches 4; every high-priority request is admitted before every
    queued low-priority one, though submitted after them."""
    with gateway_for_llama_cpp(BY_PRIORITY, max_concurrency=SLOTS) as gateway:
        async with _sdk(gateway) as sdk:
            with MetricsWatch(llama_cpp) as watch:
                fills = [
                    asyncio.ensure_future(_started_at(sdk, 4, f"fill {i}")) for i in range(FILL)
                ]
                await _wait_state(gateway, "running", SLOTS)
                lows = [asyncio.ensure_future(_started_at(sdk, 4, f"low {i}")) for i in range(LOW)]
                await _wait_state(gateway, "queued", LOW)
                highs = [
                    asyncio.ensure_future(_started_at(sdk, 0, f"high {i}")) for i in range(HIGH)
                ]
                await asyncio.wait_for(asyncio.gather(*fills, *lows, *highs), 120)
    assert watch.polls >= 20, watch.polls
    assert watch.peak["llamacpp:requests_deferred"] == 0, watch.peak
    assert watch.peak["llamacpp:requests_processing"] == SLOTS, watch.peak
    last_high = max(task.result() for task in highs)
    first_low = min(task.result() for task in lows)
    assert last_high < first_low, (last_high, first_low)


async def test_without_the_cap_the_engines_own_queue_fills(
    llama_cpp: LlamaCppServer, gateway_for_llama_cpp: GatewayFactory
) -> None:
    """The same 20 requests at once through an uncapped backend: the engine runs 4 and the
    rest wait in its own queue (``llamacpp:requests_deferred`` > 0), where the gateway can
    no longer order them. (How many are seen there at once varies, 1 to 16 here: under
    load the 20 connections reach the engine spread out.)"""
    with gateway_for_llama_cpp(BY_PRIORITY, max_concurrency=None) as gateway:
        async with _sdk(gateway) as sdk:
            with MetricsWatch(llama_cpp) as watch:
                burst = [_started_at(sdk, 4, f"burst {i}") for i in range(FILL + LOW + HIGH)]
                await asyncio.wait_for(asyncio.gather(*burst), 120)
    print(f"uncapped burst: peak deferred {watch.peak['llamacpp:requests_deferred']:.0f}")
    assert watch.peak["llamacpp:requests_processing"] == SLOTS, watch.peak
    assert 1 <= watch.peak["llamacpp:requests_deferred"] <= LOW + HIGH, watch.peak


def _until_idle(server: LlamaCppServer, since: float, within_s: float) -> float | None:
    """Seconds from ``since`` until every slot is idle (polled every 2 ms); None if not."""
    deadline = since + within_s
    while time.monotonic() < deadline:
        if server.busy_slots() == 0:
            return time.monotonic() - since
        time.sleep(0.002)
    return None


async def _disconnect_gaps(
    llama_cpp: LlamaCppServer, gateway: Stack, *, stream: bool
) -> list[float]:
    """Seconds from a client leaving a long request until ``/slots`` shows its slot idle,
    ``REPEATS`` times; each request must have been cut short."""
    gaps: list[float] = []
    body: dict[str, Any] = {
        "model": MODEL, "prompt": "leave", "max_tokens": HOLD_TOKENS, "ignore_eos": True,
        "stream": stream,
    }  # fmt: skip
    async with aiohttp.ClientSession() as session:
        for _ in range(REPEATS):
            request = asyncio.ensure_future(
                session.post(gateway.base_url + "/v1/completions", json=body)
            )
            busy = await asyncio.to_thread(wait_until, lambda: len(_task_ids(llama_cpp)) == 1, 5.0)
            assert busy, llama_cpp.slots()
            (task,) = _task_ids(llama_cpp).values()
            await asyncio.sleep(0.2)  # well into generation
            if stream:
                response = await request
                assert response.status == 200
                left = time.monotonic()
                response.close()
            else:
                left = time.monotonic()
                request.cancel()
            gap = await asyncio.to_thread(_until_idle, llama_cpp, left, 10.0)
            assert gap is not None, llama_cpp.slots()
            end = await asyncio.to_thread(_task_end, llama_cpp, task)
            assert end.cancelled, end
            assert end.n_tokens < HOLD_TOKENS, end
            gaps.append(gap)
    return gaps


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "unary"])
async def test_a_client_that_leaves_frees_its_slot_at_once(
    llama_cpp: LlamaCppServer, gateway_for_llama_cpp: GatewayFactory, stream: bool
) -> None:
    """A client leaves a long request (streamed, or non-streamed: the gateway streams that
    from the engine and reassembles it) 0.2 s into generation: ``/slots`` shows the slot
    idle within a second, every one of ``REPEATS`` times."""
    with gateway_for_llama_cpp(max_concurrency=SLOTS) as gateway:
        gaps = await _disconnect_gaps(llama_cpp, gateway, stream=stream)
    median_ms, worst_ms = statistics.median(gaps) * 1000, max(gaps) * 1000
    print(f"disconnect ({'stream' if stream else 'unary'}) -> slot idle: "
          f"median {median_ms:.1f} ms, max {worst_ms:.1f} ms")  # fmt: skip
    assert max(gaps) < FREED_WITHIN_S, gaps


async def test_the_engine_alone_keeps_generating_for_a_non_streamed_client_that_left(
    llama_cpp: LlamaCppServer,
) -> None:
    """Why the gateway streams non-streamed requests from llama-server. Asked directly, while
    another client's stream runs and ``/metrics`` is scraped, the engine generates all
    ``max_tokens`` of a non-streamed request whose client left 0.2 s in, never cancelling
    it: it looks for a departed non-streamed client only after a second without a result
    for any request (its ``HTTP_POLLING_SECONDS``), which a busy engine seldom has."""
    body: dict[str, Any] = {
        "model": MODEL, "prompt": "leave", "max_tokens": HOLD_TOKENS // 2, "ignore_eos": True,
    }  # fmt: skip
    other = {**body, "prompt": "another client", "max_tokens": HOLD_TOKENS, "stream": True}
    async with aiohttp.ClientSession() as session:
        stream = await session.post(llama_cpp.url + "/v1/completions", json=other)
        assert stream.status == 200
        (other_task,) = _task_ids(llama_cpp).values()
        request = asyncio.ensure_future(session.post(llama_cpp.url + "/v1/completions", json=body))
        busy = await asyncio.to_thread(wait_until, lambda: len(_task_ids(llama_cpp)) == 2, 5.0)
        (task,) = set(_task_ids(llama_cpp).values()) - {other_task}
        await asyncio.sleep(0.2)
        with MetricsWatch(llama_cpp, every_s=0.05):
            request.cancel()
            drained = asyncio.ensure_future(stream.read())
            end = await asyncio.to_thread(_task_end, llama_cpp, task)
            await drained
    assert busy
    assert end == TaskEnd(cancelled=False, n_tokens=end.n_tokens)
    assert end.n_tokens >= HOLD_TOKENS // 2


def _task_ids(server: LlamaCppServer) -> dict[int, int]:
    """Slot id -> id of the task it is processing, for the busy slots."""
    return {s["id"]: s["id_task"] for s in server.slots() if s["is_processing"]}


def _task_end(server: LlamaCppServer, task: int) -> TaskEnd:
    """How ``task`` ended (waiting up to 30 s for the server to release it)."""
    ended = wait_until(lambda: server.task_end(task) is not None, 30.0)
    end = server.task_end(task)
    assert ended, f"task {task} still running"
    assert end is not None
    return end


def _watch_reuse(
    server: LlamaCppServer, victims: dict[int, int], within_s: float
) -> tuple[float, float] | None:
    """Poll ``/slots`` (every 2 ms) until a victim's task leaves its slot and then a task
    that is no victim runs: the monotonic times of both; None if not within ``within_s``."""
    deadline = time.monotonic() + within_s
    freed: float | None = None
    while time.monotonic() < deadline:
        running = _task_ids(server)
        now = time.monotonic()
        if freed is None and any(running.get(slot) != task for slot, task in victims.items()):
            freed = now
        if freed is not None and set(running.values()) - set(victims.values()):
            return freed, now
        time.sleep(0.002)
    return None


async def test_a_preempted_request_frees_its_slot_for_the_interactive_one(
    llama_cpp: LlamaCppServer, gateway_for_llama_cpp: GatewayFactory
) -> None:
    """Four best-effort streams (``preemptible: always``) fill the 4 slots; an interactive
    request turns urgent after ``preempt_after_ms`` and preempts one: ``/slots`` shows the
    victim's slot given up within a second of the interactive request's admission, and that
    request running in it within a second of that; the engine's queue holds at most that
    one request meanwhile (``requests_deferred`` <= 1: the gateway may send it before the
    engine frees the slot), and it was admitted within 0.5 s of turning urgent."""
    figures: list[tuple[float, float, float]] = []
    deferred: list[float] = []
    with gateway_for_llama_cpp(PREEMPT, max_concurrency=SLOTS) as gateway:
        async with aiohttp.ClientSession() as session, _sdk(gateway) as sdk:
            for _ in range(3):
                body = {
                    "model": MODEL, "prompt": "victim", "max_tokens": HOLD_TOKENS,
                    "ignore_eos": True, "stream": True,
                }  # fmt: skip
                victims = [
                    await session.post(
                        gateway.base_url + "/v1/completions", json=body, headers=BEST_EFFORT
                    )
                    for _ in range(SLOTS)
                ]
                full = await asyncio.to_thread(
                    wait_until, lambda: llama_cpp.busy_slots() == SLOTS, 5.0
                )
                assert full, llama_cpp.slots()
                before = _task_ids(llama_cpp)
                watcher = asyncio.ensure_future(
                    asyncio.to_thread(_watch_reuse, llama_cpp, before, 10.0)
                )
                submitted = time.monotonic()
                with MetricsWatch(llama_cpp) as watch:
                    raw = await sdk.completions.with_raw_response.create(
                        model=MODEL, prompt="urgent", max_tokens=BURST_TOKENS, temperature=0.0
                    )
                reuse = await watcher
                deferred.append(watch.peak["llamacpp:requests_deferred"])
                queue_ms = float(raw.headers["x-sluicegate-queue-ms"])
                for victim in victims:
                    victim.close()
                await asyncio.to_thread(llama_cpp.wait_idle, 10.0)
                assert reuse is not None, "no slot was given up and reused"
                freed, reused = reuse
                preempted = submitted + queue_ms / 1000  # the victim's slot went to it then
                figures.append((freed - preempted, reused - freed, queue_ms))
    for to_free, to_reuse, queue_ms in figures:
        print(f"preemption: admitted->victim's slot freed {to_free * 1000:.0f} ms, "
              f"freed->reused {to_reuse * 1000:.0f} ms, queue {queue_ms:.0f} ms")  # fmt: skip
    assert max(deferred) <= 1, deferred
    for to_free, to_reuse, queue_ms in figures:
        assert to_free < FREED_WITHIN_S
        assert to_reuse < FREED_WITHIN_S
        assert URGENT_AFTER_MS * 0.9 <= queue_ms < URGENT_AFTER_MS + 500
