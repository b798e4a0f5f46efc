"""The real-time loop that steps the sans-I/O ``Engine`` and delivers tokens to requests.

One asyncio task owns the engine. While it has work it repeats::

    result = engine.step(now)          # the step's effects apply here
    await sleep until now + result.duration_s
    deliver result.tokens / result.finished to the requests' queues
    after_step()                       # e.g. publish the step's KV events

and sleeps on an ``asyncio.Event`` when idle; ``submit`` sets it. A request
aborted while its step sleeps is gone from ``_live``, so the tokens that step
computed for it are dropped.

The engine's ``response_overhead_s`` (a token's time from its step to the client)
delays each step's delivery by that constant, in step order, without holding up the
next step; the request's end, which follows its last token, is delayed with it.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import StrEnum

from sluicegate.emulator.openai_wire import ApiError
from sluicegate.emulator.personalities.personality import EngineMetrics
from sluicegate.emulator.text import FakeText
from sluicegate.engine import Engine, StepResult

# Step starts are chained to the modelled timeline (t_{k+1} = t_k + duration_k)
# rather than re-read from the clock, because timers on uvloop have millisecond
# granularity and re-reading would add that rounding to every ~2 ms step. Past
# this lag (an overloaded loop) the timeline resyncs to the clock instead of
# running a burst of late steps back to back.
_MAX_LAG_S = 0.05

_log = logging.getLogger(__name__)


class FinishReason(StrEnum):
    """Why a request's stream ended (OpenAI ``finish_reason``; vLLM's metric label)."""

    STOP = "stop"
    LENGTH = "length"
    ABORT = "abort"


@dataclass(frozen=True, slots=True)
class Token:
    """One emitted token, as the runner delivers it."""

    text: str


@dataclass(frozen=True, slots=True)
class Finish:
    """The end of a request's stream; no event follows it."""

    reason: FinishReason


Event = Token | Finish


class RequestStream:
    """One submitted request: its sizes, timings and the queue its events arrive on.

    Attributes:
        req_id: the engine's id for the request.
        prompt_tokens: the prompt size given to the engine.
        max_tokens: the request's output cap.
        arrival_s: loop time of submission.
        completion_tokens: tokens delivered so far.
    """

    __slots__ = ("_last_token_s", "_queue", "_text", "arrival_s", "completion_tokens",
                 "max_tokens", "prompt_tokens", "req_id")  # fmt: skip

    def __init__(
        self, req_id: str, prompt_tokens: int, max_tokens: int, arrival_s: float, seed: int
    ) -> None:
        self.req_id = req_id
        self.prompt_tokens = prompt_tokens
        self.max_tokens = max_tokens
        self.arrival_s = arrival_s
        self.completion_tokens = 0
        self._last_token_s = arrival_s
        self._text = FakeText(req_id, seed)
        self._queue: asyncio.Queue[Event] = asyncio.Queue()

    async def next_event(self) -> Event:
        """Wait for the request's next token or its finish."""
        return await self._queue.get()

    def _push_token(self, now: float) -> float:
        """Queue one token; returns the time since the previous one (or since arrival)."""
        gap = now - self._last_token_s
        self._last_token_s = now
        self.completion_tokens += 1
        self._queue.put_nowait(Token(self._text.next_token()))
        return gap

    def _push_finish(self, reason: FinishReason) -> None:
        self._queue.put_nowait(Finish(reason))


class ChoiceEvents:
    """The events of a request's ``n`` engine sequences, as they come: (choice, event)."""

    def __init__(self, streams: list[RequestStream]) -> None:
        self.streams = streams
        self._waiting: dict[asyncio.Task[Event], int] = {}

    async def next(self) -> tuple[int, Event]:
        """The next event of any choice that has not finished (one at a time)."""
        if len(self.streams) == 1:
            return 0, await self.streams[0].next_event()
        if not self._waiting:
            for index, stream in enumerate(self.streams):
                self._waiting[asyncio.ensure_future(stream.next_event())] = index
        done, _ = await asyncio.wait(self._waiting, return_when=asyncio.FIRST_COMPLETED)
        task = min(done, key=lambda t: self._waiting[t])
        index = self._waiting.pop(task)
        event = task.result()
        if not isinstance(event, Finish):
            self._waiting[asyncio.ensure_future(self.streams[index].next_event())] = index
        return index, event

    def close(self) -> None:
        """Stop waiting for events (the sequences themselves are aborted by the caller)."""
        for task in self._waiting:
            task.cancel()
        self._waiting.clear()


@dataclass(frozen=True, slots=True)
class RunnerStats:
    """A snapshot of the emulator for ``GET /emulator/stats`` (tests and demos)."""

    running: int
    waiting: int
    max_running_seen: int
    admitted_total: int
    aborted_total: int
    finished_total: int
    kv_cache_usage: float
    prefix_cache_query_tokens: int
    prefix_cache_hit_tokens: int
    prefix_cache_hit_rate: float


class EngineRunner:
    """Steps an ``Engine`` in real time on the running event loop and feeds request streams.

    Args:
        engine: the engine to drive; the runner is its only user.
        metrics: where token, latency and outcome metrics go.
        seed: seeds each request's fake text (with its id).
        after_step: called after each step's outputs are delivered (a KV event publisher
            drains the prefix cache's stores and evictions there).
    """

    def __init__(
        self,
        engine: Engine,
        metrics: EngineMetrics,
        *,
        seed: int = 0,
        after_step: Callable[[], None] | None = None,
    ) -> None:
        self._engine = engine
        self._after_step = after_step
        self._metrics = metrics
        self._seed = seed
        self._live: dict[str, RequestStream] = {}
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._max_running_seen = 0
        self._admitted = self._aborted = self._finished = 0
        self._delayed: deque[StepResult] = deque()

    def start(self) -> None:
        """Start the stepping task on the running loop."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        """Stop stepping and abort every live request (their streams end with ``abort``)."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.wait({task})
        for req_id in list(self._live):
            self.abort(req_id)

    async def request_overhead(self) -> None:
        """Wait the engine's ``request_overhead_s``: a request's time from the client to
        the engine's queue (HTTP, parsing, tokenization), spent before ``submit``."""
        overhead = self._engine.config.request_overhead_s
        if overhead > 0.0:
            await asyncio.sleep(overhead)

    def is_live(self, req_id: str) -> bool:
        """Whether the request was submitted and has not finished or been aborted."""
        return req_id in self._live

    def submit(
        self,
        req_id: str,
        prompt_tokens: int,
        max_tokens: int,
        *,
        ignore_eos: bool = False,
        priority: int = 0,
        prefix: Sequence[int] = (),
    ) -> RequestStream:
        """Queue a request in the engine and return the stream its events will arrive on.

        ``prefix``: the prompt's KV block hashes, for the engine's prefix cache (none: the
        request neither uses nor fills it).

        ``priority`` (lower first) orders it only on an engine with
        ``scheduling_policy="priority"``; an ``fcfs`` engine refuses any but 0 with
        vLLM's message (``vllm/v1/engine``'s input processing).

        Raises:
            ApiError: 400, a non-zero ``priority`` on an ``fcfs`` engine.
            ValueError: the engine refuses it (duplicate id, or too long for its KV cache).
        """
        if priority != 0 and self._engine.config.scheduling_policy != "priority":
            message = f"Got priority {priority} but Priority scheduling is not enabled."
            raise ApiError(400, message, "invalid_request", "priority")
        now = asyncio.get_running_loop().time()
        self._engine.add_request(
            req_id, prompt_tokens, max_tokens, now,
            ignore_eos=ignore_eos, priority=priority, prefix=prefix,
        )  # fmt: skip
        stream = RequestStream(req_id, prompt_tokens, max_tokens, now, self._seed)
        self._live[req_id] = stream
        self._admitted += 1
        self._wake.set()
        return stream

    def abort(self, req_id: str) -> bool:
        """Abort a live request at once: free its KV and end its stream with ``abort``.

        Returns:
            Whether the request was live (False once it finished or was aborted).
        """
        stream = self._live.pop(req_id, None)
        if stream is None:
            return False
        self._engine.abort(req_id, now=asyncio.get_running_loop().time())
        self._aborted += 1
        self._metrics.finished(FinishReason.ABORT, None)
        stream._push_finish(FinishReason.ABORT)
        return True

    def stats(self) -> RunnerStats:
        """The current engine state and the runner's counters."""
        engine = self._engine
        return RunnerStats(
            running=engine.num_requests_running,
            waiting=engine.num_requests_waiting,
            max_running_seen=self._max_running_seen,
            admitted_total=self._admitted,
            aborted_total=self._aborted,
            finished_total=self._finished,
            kv_cache_usage=engine.kv_cache_usage,
            prefix_cache_query_tokens=engine.prefix_cache.query_tokens,
            prefix_cache_hit_tokens=engine.prefix_cache.hit_tokens,
            prefix_cache_hit_rate=engine.prefix_cache.hit_rate,
        )

    async def _run(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            try:
                await self._drain()
            except Exception:
                # A bug in a step must not leave clients hanging on streams that never end.
                _log.exception("engine step failed; aborting all live requests")
                for req_id in list(self._live):
                    self.abort(req_id)

    async def _drain(self) -> None:
        """Step the engine until it is idle, one real-time step after another."""
        loop = asyncio.get_running_loop()
        start = loop.time()
        while (result := self._engine.step(start)) is not None:
            self._max_running_seen = max(self._max_running_seen, self._engine.num_requests_running)
            self._metrics.preempted(len(result.preempted))
            end = start + result.duration_s
            delay = end - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            now = loop.time()
            self._deliver_after_overhead(result, now)
            if self._after_step is not None:
                self._after_step()
            start = end if now - end < _MAX_LAG_S else now

    def _deliver_after_overhead(self, result: StepResult, now: float) -> None:
        """Deliver now, or ``response_overhead_s`` later. Delayed steps wait in a queue that
        each timer pops from its head, so they arrive in step order even when two timers
        fall due at the same loop time."""
        overhead = self._engine.config.response_overhead_s
        if overhead <= 0.0:
            self._deliver(result, now)
            return
        self._delayed.append(result)
        loop = asyncio.get_running_loop()
        loop.call_at(now + overhead, lambda: self._deliver(self._delayed.popleft(), loop.time()))

    def _deliver(self, result: StepResult, now: float) -> None:
        """Hand a finished step's tokens and finishes to the requests still live."""
        metrics = self._metrics
        for req_id, count in result.tokens.items():
            stream = self._live.get(req_id)
            if stream is None:
                continue  # aborted while the step ran: its tokens are dropped
            for _ in range(count):
                first = stream.completion_tokens == 0
                gap = stream._push_token(now)
                if first:
                    metrics.first_token(stream.prompt_tokens, gap)
                else:
                    metrics.next_token(gap)
        for req_id in result.finished:
            stream = self._live.pop(req_id, None)
            if stream is None:
                continue
            reason = FinishReason.LENGTH
            if stream.completion_tokens < stream.max_tokens:
                reason = FinishReason.STOP
            self._finished += 1
            metrics.finished(reason, now - stream.arrival_s)
            stream._push_finish(reason)
