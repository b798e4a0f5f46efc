"""The client side of the distributed-mode benchmark: an open-loop generator that never
waits for a response to launch the next request (saturation_probe's lean loop, with several
targets interleaved and each target's requests spread round-robin over its gateways), the
cross-replica hand-off probe, and the parking of many waiting requests.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass

import aiohttp
import orjson

__all__ = [
    "Answer",
    "Handoff",
    "Target",
    "client_session",
    "fire",
    "handoff",
    "interleaved",
    "park",
    "spread",
]

CHAT_PATH = "/v1/chat/completions"


@dataclass(frozen=True, slots=True)
class Target:
    """Where a stream of identical requests goes, and as whom.

    Attributes:
        name: the row it is reported under.
        urls: base URLs its requests go to, round-robin.
        key: the API key sent as a bearer token.
        model: the model asked for.
        max_tokens: output tokens of every request (``ignore_eos``: exactly these).
    """

    name: str
    urls: tuple[str, ...]
    key: str
    model: str
    max_tokens: int = 2

    @property
    def body(self) -> bytes:
        """The request body: a one-word chat."""
        message = {"role": "user", "content": "hello"}
        return orjson.dumps(
            {
                "model": self.model,
                "messages": [message],
                "max_tokens": self.max_tokens,
                "ignore_eos": True,
            }
        )

    @property
    def headers(self) -> dict[str, str]:
        """JSON content and the bearer token."""
        return {"Content-Type": "application/json", "Authorization": f"Bearer {self.key}"}


Shot = tuple[float, Target, str]
"""One request of a plan: (start, seconds from the plan's start; target; base URL)."""


@dataclass(frozen=True, slots=True)
class Answer:
    """One request as the client saw it.

    Attributes:
        target: the target's name.
        lag_s: how late it was launched against its schedule.
        sent: ``perf_counter()`` at launch.
        done: ``perf_counter()`` when the whole answer was read (or the failure).
        error: ``""`` for a 200, else ``HTTP <status>`` or the exception's class name.
        queue_ms: the gateway's ``X-Sluicegate-Queue-Ms`` (arrival to admission), if sent.
    """

    target: str
    lag_s: float
    sent: float
    done: float
    error: str
    queue_ms: float | None

    @property
    def latency_s(self) -> float:
        """Launch to the end of the answer."""
        return self.done - self.sent


def interleaved(targets: Sequence[Target], n: int, rate: float) -> list[Shot]:
    """``n`` requests per target at ``rate`` per target: request i of target k starts at
    ``(i + ((k + i) mod K) / K) / rate``, so a slot's K requests are 1/K of a gap apart
    and which target goes first rotates from slot to slot."""
    count = len(targets)
    shots = [
        ((i + ((k + i) % count) / count) / rate, target, target.urls[i % len(target.urls)])
        for i in range(n)
        for k, target in enumerate(targets)
    ]
    return sorted(shots, key=lambda shot: shot[0])


def spread(target: Target, n: int, rate: float) -> list[Shot]:
    """``n`` requests at a constant ``rate``, round-robin over the target's gateways."""
    return [(i / rate, target, target.urls[i % len(target.urls)]) for i in range(n)]


async def _send(
    session: aiohttp.ClientSession, target: Target, url: str
) -> tuple[str, float | None, float]:
    """(error, ``X-Sluicegate-Queue-Ms``, ``perf_counter()`` when the answer was read)."""
    try:
        async with session.post(url + CHAT_PATH, data=target.body, headers=target.headers) as r:
            await r.read()
            error = "" if r.status == 200 else f"HTTP {r.status}"
            queue = r.headers.get("x-sluicegate-queue-ms")
            return error, (float(queue) if queue is not None else None), time.perf_counter()
    except (aiohttp.ClientError, OSError, TimeoutError) as exc:
        return type(exc).__name__, None, time.perf_counter()


def client_session(timeout_s: float) -> aiohttp.ClientSession:
    """A client session without a connection limit, every request timed out after ``timeout_s``."""
    connector = aiohttp.TCPConnector(limit=0)
    return aiohttp.ClientSession(
        connector=connector, timeout=aiohttp.ClientTimeout(total=timeout_s)
    )


async def fire(plan: Sequence[Shot], timeout_s: float) -> list[Answer]:
    """Launch every shot of ``plan`` on time; return the answers in completion order."""
    clock = time.perf_counter  # uvloop's loop.time() ticks in whole milliseconds
    answers: list[Answer] = []

    async def one(at: float, target: Target, url: str, start: float) -> None:
        sent = clock()
        error, queue_ms, done = await _send(session, target, url)
        answers.append(Answer(target.name, sent - start - at, sent, done, error, queue_ms))

    async with client_session(timeout_s) as session, asyncio.TaskGroup() as group:
        start = clock()
        for at, target, url in plan:
            delay = start + at - clock()
            if delay > 0.0:
                await asyncio.sleep(delay)
            group.create_task(one(at, target, url, start))
    return answers


@dataclass(frozen=True, slots=True)
class Handoff:
    """One hand-off of a cap-1 model's slot from request A to request B.

    Attributes:
        grant_s: A's answer read by the client → B admitted (B's send time plus its
            ``X-Sluicegate-Queue-Ms``), on the client's clock.
        verdict: ``ok``; ``failed`` (an error, or A had to queue: the sample says
            nothing); ``early`` (B was admitted while A still ran: the cap did not hold).
    """

    grant_s: float
    verdict: str


async def handoff(
    session: aiohttp.ClientSession,
    holder: Target,
    waiter: Target,
    gap_s: float,
    min_wait_ms: float,
) -> Handoff:
    """Send ``holder`` (it takes the slot), ``gap_s`` later ``waiter`` (it must queue for at
    least ``min_wait_ms``), and time how long after the holder's end the waiter was admitted."""
    first = asyncio.create_task(_send(session, holder, holder.urls[0]))
    await asyncio.sleep(gap_s)
    sent = time.perf_counter()
    second = asyncio.create_task(_send(session, waiter, waiter.urls[0]))
    held_error, held_queue, held_done = await first
    wait_error, wait_queue, _ = await second
    grant = sent + (wait_queue or 0.0) / 1000 - held_done
    if held_error or wait_error or held_queue is None or wait_queue is None:
        return Handoff(grant, "failed")
    if held_queue >= gap_s * 1000:
        return Handoff(grant, "failed")
    return Handoff(grant, "early" if wait_queue < min_wait_ms else "ok")


async def park(session: aiohttp.ClientSession, target: Target, n: int, rate: float) -> None:
    """Send ``n`` requests to ``target`` at ``rate`` per second and hold their connections open
    until cancelled (cancelling closes them: the gateway drops the tickets)."""
    async with asyncio.TaskGroup() as group:
        for i in range(n):
            group.create_task(_send(session, target, target.urls[0]))
            if i % 100 == 99:
                await asyncio.sleep(100 / rate)
