"""Preemption over real HTTP (DESIGN §7): who is stopped, when, and what each client sees.

Best-effort work runs at priority 4 (``X-Sluicegate-Priority: 4``) so that an
interactive request at the default priority 2 is a higher tier; the
interactive lane turns a waiting request urgent after ``preempt_after_ms``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

import aiohttp
import openai
import orjson
from openai.types import Completion

from tests.gateway.gateway_harness import (
    FAST_PRIORS,
    MODEL,
    Stack,
    engine_stats,
    finish_reason,
    model_state,
    open_stream,
    outcomes,
    read_events,
    stack,
    text_chunks,
    wait_until,
)

URGENT_AFTER_MS = 100


def _urgent_interactive_over_best_effort(cap: int, action: str) -> str:
    """An ``interactive`` lane turning urgent after ``URGENT_AFTER_MS`` and a ``best_effort``
    lane preempted with ``action``, ``cap`` slots each and for the model."""
    return f"""    max_concurrency: {cap}
{FAST_PRIORS}    lanes:
      - {{name: interactive, max_concurrency: {cap}, preemptible: never,
          preempt_after_ms: {URGENT_AFTER_MS}}}
      - {{name: best_effort, max_concurrency: {cap}, preemptible: always, preempt_action: {action},
          policy: fifo}}
"""


PREEMPT = _urgent_interactive_over_best_effort(2, "abort")
REQUEUE = _urgent_interactive_over_best_effort(1, "requeue")
BY_PRIORITY = f"""    max_concurrency: 2
{FAST_PRIORS}    lanes:
      - {{name: main, max_concurrency: 2, preemptible: priority, policy: priority,
          preempt_after_ms: {URGENT_AFTER_MS}}}
"""
# The scheduler's decode-rate prior sits above the tiny engine's real ~450 tokens/s per
# stream, so its estimate of when a victim passes 80% is early rather than late.
BY_PRIORITY_PACED = BY_PRIORITY.replace(
    "prior_decode_tokens_per_s: 100000.0", "prior_decode_tokens_per_s: 1000.0"
)
BY_DEADLINE = f"""    max_concurrency: 1
{FAST_PRIORS}    lanes:
      - {{name: interactive, max_concurrency: 1, preemptible: never, slo_ms: 1500}}
      - {{name: best_effort, max_concurrency: 1, preemptible: always, policy: fifo}}
"""
T = TypeVar("T")
BEST_EFFORT = {"X-Sluicegate-Lane": "best_effort", "X-Sluicegate-Priority": "4"}
OPENED = 2  # text events ``open_stream`` reads before handing a stream over


def _sdk(gateway: Stack) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(
        base_url=gateway.base_url + "/v1", api_key="unused", max_retries=0, timeout=30
    )


async def _interactive(
    sdk: openai.AsyncOpenAI, headers: dict[str, str] | None = None
) -> tuple[float, str | None]:
    """A short non-streamed interactive completion: (its queue ms, its finish reason)."""
    raw = await sdk.completions.with_raw_response.create(
        model=MODEL, prompt="urgent", max_tokens=5, extra_body={"ignore_eos": True},
        extra_headers=headers or {},
    )  # fmt: skip
    completion = raw.parse()
    return float(raw.headers["x-sluicegate-queue-ms"]), completion.choices[0].finish_reason


async def _background(
    sdk: openai.AsyncOpenAI, max_tokens: int
) -> tuple[dict[str, str], Completion]:
    """A non-streamed priority-4 best-effort completion: (response headers, parsed body)."""
    raw = await sdk.completions.with_raw_response.create(
        model=MODEL, prompt="background", max_tokens=max_tokens,
        extra_body={"ignore_eos": True}, extra_headers=BEST_EFFORT,
    )  # fmt: skip
    assert raw.http_response.status_code == 200
    return {name.lower(): value for name, value in raw.headers.items()}, raw.parse()


async def _first_to_end(
    readers: list[asyncio.Task[list[bytes]]], within_s: float
) -> list[bytes] | None:
    """The events of the first stream to end within ``within_s``, else ``None``."""
    done, _ = await asyncio.wait(readers, timeout=within_s, return_when=asyncio.FIRST_COMPLETED)
    return next(iter(done)).result() if done else None


async def test_urgent_interactive_request_preempts_a_best_effort_stream() -> None:
    """Two priority-4 best-effort streams fill the model; an interactive request arrives and
    turns urgent after ``preempt_after_ms``: one stream ends with the text generated so far,
    a final chunk with ``finish_reason: "preempted"`` and ``data: [DONE]``; the interactive
    request is admitted within one tick of turning urgent; the engine aborted the stream."""
    with stack(PREEMPT) as gateway:
        async with aiohttp.ClientSession() as session, _sdk(gateway) as sdk:
            victims = [
                await open_stream(session, gateway.base_url, events=OPENED, headers=BEST_EFFORT)
                for _ in range(2)
            ]
            readers = [asyncio.ensure_future(read_events(v)) for v in victims]
            queue_ms, reason = await _interactive(sdk)
            ended = await _first_to_end(readers, 2.0)
            for victim in victims:
                victim.close()
            await asyncio.gather(*readers, return_exceptions=True)
            aborted = await asyncio.to_thread(
                wait_until, lambda: engine_stats(gateway.engine_url())["aborted_total"] >= 1, 1.0
            )
            stats = engine_stats(gateway.engine_url())
    assert reason == "length"
    assert URGENT_AFTER_MS * 0.9 <= queue_ms < URGENT_AFTER_MS + 400
    assert ended is not None, "no best-effort stream was preempted"
    assert ended[-1] == b"[DONE]"
    assert finish_reason(ended[-2]) == "preempted"
    assert text_chunks(ended) > 0  # the partial answer reached the client
    assert aborted
    assert stats["finished_total"] == 1  # only the interactive request ran to its end


async def test_preempted_non_streaming_request_gets_a_preempted_body_and_header() -> None:
    """A non-streamed best-effort request (``preempt_action: abort``) that is preempted for an
    urgent interactive one gets 200 with a normal completion body holding the text generated
    so far (and a usage counting exactly its tokens), ``finish_reason: "preempted"`` and the
    header ``X-Sluicegate-Preempted: 1``; it is counted as ``preempted``."""
    with stack(PREEMPT.replace("max_concurrency: 2", "max_concurrency: 1")) as gateway:
        async with _sdk(gateway) as sdk:
            victim = asyncio.ensure_future(_background(sdk, 3000))
            running = await asyncio.to_thread(
                wait_until, lambda: model_state(gateway.base_url)["running"] == 1, 2.0
            )
            queue_ms, _ = await _interactive(sdk)
            headers, completion = await asyncio.wait_for(victim, 2.0)
            counted = outcomes(gateway.base_url)
    assert running
    assert queue_ms < URGENT_AFTER_MS + 400
    assert headers.get("x-sluicegate-preempted") == "1"
    assert completion.object == "text_completion"
    assert str(completion.choices[0].finish_reason) == "preempted"
    text = completion.choices[0].text
    assert text  # the partial answer reached the client
    assert completion.usage is not None
    # The emulator generates one word per token: the usage counts exactly the text relayed.
    assert 0 < completion.usage.completion_tokens == len(text.split()) < 3000, completion
    assert counted == {"completed": 1, "preempted": 1}


async def test_requeued_request_is_rerun_and_answered_once_in_full() -> None:
    """A non-streamed best-effort request in a ``preempt_action: requeue`` lane, preempted for
    an interactive one, is re-run after it transparently: its client gets exactly one complete
    answer (``completion_tokens == max_tokens``), the engine saw it twice (one abort), and
    ``sluicegate_requests_total`` counts two completions and no preemption."""
    with stack(REQUEUE) as gateway:
        async with _sdk(gateway) as sdk:
            victim = asyncio.ensure_future(_background(sdk, 600))
            running = await asyncio.to_thread(
                wait_until, lambda: model_state(gateway.base_url)["running"] == 1, 2.0
            )
            await asyncio.sleep(0.1)
            queue_ms, _ = await _interactive(sdk)
            headers, completion = await asyncio.wait_for(victim, 10.0)
            counted = outcomes(gateway.base_url)
            stats = engine_stats(gateway.engine_url())
    assert running
    assert queue_ms < URGENT_AFTER_MS + 400
    assert "x-sluicegate-preempted" not in headers
    assert completion.usage is not None
    assert completion.usage.completion_tokens == 600
    assert completion.choices[0].finish_reason == "length"
    assert (stats["admitted_total"], stats["aborted_total"], stats["finished_total"]) == (3, 1, 2)
    assert counted.get("preempted", 0) == 0
    assert counted == {"completed": 2}


async def _urgent_behind_two(
    config: str,
    priority: str,
    tokens: int,
    read: Callable[[aiohttp.ClientResponse], Awaitable[T]],
) -> tuple[list[T], float, dict[str, float]]:
    """Two streams of ``tokens`` at ``priority`` fill the lane of ``config``, then an urgent
    priority-0 request arrives: what ``read`` made of each stream to its end, the waiter's
    queue ms, and the engine's stats once both streams ended."""
    with stack(config) as gateway:
        async with aiohttp.ClientSession() as session, _sdk(gateway) as sdk:
            headers = {"X-Sluicegate-Priority": priority}
            victims = [
                await open_stream(
                    session, gateway.base_url, events=OPENED, max_tokens=tokens, headers=headers
                )
                for _ in range(2)
            ]
            readers = [asyncio.ensure_future(read(v)) for v in victims]
            queue_ms, _ = await _interactive(sdk, {"X-Sluicegate-Priority": "0"})
            ended = await asyncio.gather(*readers)
            for victim in victims:
                victim.close()
            stats = engine_stats(gateway.engine_url())
    return list(ended), queue_ms, stats


async def test_critical_priority_stream_is_never_preempted() -> None:
    """In a ``preemptible: priority`` lane, priority-1 streams are never preempted, not even
    for an urgent priority-0 request: both run to ``max_tokens`` and the waiter is admitted
    only when one of them ends."""
    tokens = 500
    ended, queue_ms, stats = await _urgent_behind_two(BY_PRIORITY, "1", tokens, read_events)
    assert [finish_reason(events[-2]) for events in ended] == ["length", "length"]
    assert [OPENED + text_chunks(events) for events in ended] == [tokens, tokens]
    assert stats["aborted_total"] == 0
    assert queue_ms > 5 * URGENT_AFTER_MS  # it waited for a victim to finish (~1 s)


async def _stream_until_end(response: aiohttp.ClientResponse) -> tuple[int, str | None]:
    """Read a completions stream to its end: (text chunks read, the last finish reason)."""
    reason: str | None = None
    count = 0
    while line := await response.content.readline():
        if not line.startswith(b"data:") or line[5:].strip() == b"[DONE]":
            continue
        choice = (orjson.loads(line[5:]).get("choices") or [{}])[0]
        count += bool(choice.get("text"))
        reason = choice.get("finish_reason") or reason
    return count, reason


async def test_standard_priority_stream_is_preempted_only_after_80_percent() -> None:
    """In a ``preemptible: priority`` lane, a priority-3 stream with ``max_tokens: 1000`` is
    not preempted for an urgent priority-0 request before it has generated 800 tokens, and is
    preempted once it has (before it would have finished on its own)."""
    tokens = 1000
    ended, _, _ = await _urgent_behind_two(BY_PRIORITY_PACED, "3", tokens, _stream_until_end)
    reasons = sorted(reason or "" for _, reason in ended)
    assert reasons == ["length", "preempted"], ended
    preempted_count = OPENED + next(count for count, reason in ended if reason == "preempted")
    assert 0.8 * tokens <= preempted_count < tokens


async def test_waiter_preempts_when_its_deadline_slack_runs_out() -> None:
    """Without ``preempt_after_ms``, an interactive request (``slo_ms: 1500``) blocked by a
    priority-4 stream is not admitted early, but is admitted within one tick of its slack
    reaching zero (deadline minus predicted service time): queue time ≈ 1.5 s."""
    with stack(BY_DEADLINE) as gateway:
        async with aiohttp.ClientSession() as session, _sdk(gateway) as sdk:
            victim = await open_stream(
                session, gateway.base_url, events=OPENED, headers=BEST_EFFORT
            )
            reader = asyncio.ensure_future(read_events(victim))
            queue_ms, _ = await _interactive(sdk)
            events = await asyncio.wait_for(reader, 2.0)
            victim.close()
    assert 1300 <= queue_ms < 1900
    assert finish_reason(events[-2]) == "preempted"
