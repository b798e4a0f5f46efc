"""The client side of the live Prometheus test: load through the gateway, and what it saw.

Requests are chat completions with ``ignore_eos`` (exactly ``max_tokens`` tokens,
10 ms each on the ``independent`` engine preset); every third one is streamed.
Each reply is classified into the gateway's ``outcome`` label from its status
and error code, so the client's tally can be compared with the counters.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import aiohttp
import orjson

from tests.deploy.live_stack import TENANTS, Tenant

# The error codes the gateway answers with, and the outcome each is counted under.
CODE_OUTCOMES = {
    "rate_limit_exceeded": "rejected_rate_limit",
    "queue_full": "rejected_queue_full",
    "overloaded": "shed",
    "draining": "rejected_unavailable",
    "no_healthy_backend": "rejected_unavailable",
    "queue_timeout": "expired",
}
MAX_TOKENS = 20


@dataclass(frozen=True)
class Reply:
    """One request as the client saw it.

    Attributes:
        tenant: whose key it carried.
        lane: the lane it asked for.
        streamed: whether it asked for a stream.
        status: the HTTP status.
        code: the error body's ``code`` (None for a 200).
        completion_tokens: tokens it received (counted chunks when streamed).
    """

    tenant: str
    lane: str
    streamed: bool
    status: int
    code: str | None
    completion_tokens: int = 0

    @property
    def outcome(self) -> str:
        """The gateway ``outcome`` label this reply should be counted under."""
        if self.status == 200:
            return "completed"
        return CODE_OUTCOMES.get(self.code or "", f"unexpected:{self.status}:{self.code}")


def _chunk_tokens(payload: bytes) -> int:
    """1 when a stream chunk carries generated text, else 0."""
    body = orjson.loads(payload)
    choices = body.get("choices") or []
    return int(bool(choices and (choices[0].get("delta") or {}).get("content")))


async def send(
    session: aiohttp.ClientSession,
    base_url: str,
    model: str,
    tenant: Tenant,
    *,
    lane: str | None = None,
    stream: bool = False,
    max_tokens: int = MAX_TOKENS,
) -> Reply:
    """One chat completion for ``tenant`` (in ``lane``, default its own); read to the end."""
    lane = lane or tenant.lane
    body = {
        "model": model,
        "messages": [{"role": "user", "content": "Summarise the admission queue."}],
        "max_tokens": max_tokens,
        "ignore_eos": True,
        "stream": stream,
    }
    headers = {"Authorization": f"Bearer {tenant.key}", "X-Sluicegate-Lane": lane}
    url = base_url + "/v1/chat/completions"
    async with session.post(url, json=body, headers=headers) as response:
        if response.status != 200:
            error = orjson.loads(await response.read())["error"]
            return Reply(tenant.name, lane, stream, response.status, error["code"])
        if not stream:
            usage = orjson.loads(await response.read())["usage"]
            return Reply(tenant.name, lane, stream, 200, None, usage["completion_tokens"])
        tokens = 0
        async for line in response.content:
            if line.startswith(b"data: ") and line.strip() != b"data: [DONE]":
                tokens += _chunk_tokens(line[6:])
        return Reply(tenant.name, lane, stream, 200, None, tokens)


async def open_loop(
    base_url: str, model: str, rates: Sequence[tuple[Tenant, float]], duration_s: float
) -> list[Reply]:
    """Each ``(tenant, requests/s)`` sent on schedule for ``duration_s`` (not waiting for
    answers), every third request of each tenant streamed; every reply."""
    timeout = aiohttp.ClientTimeout(total=60)
    async with aiohttp.ClientSession(timeout=timeout) as session:

        async def tenant_load(tenant: Tenant, rate: float) -> list[Reply]:
            start = time.monotonic()
            sends = []
            for k in range(round(rate * duration_s)):
                await asyncio.sleep(max(0.0, start + k / rate - time.monotonic()))
                request = send(session, base_url, model, tenant, stream=k % 3 == 2)
                sends.append(asyncio.create_task(request))
            return list(await asyncio.gather(*sends))

        per_tenant = await asyncio.gather(*(tenant_load(t, r) for t, r in rates))
    return [reply for replies in per_tenant for reply in replies]


async def warm_up(base_url: str, model: str) -> list[Reply]:
    """One request of each tenant, plus one the rate limit refuses, so that every series the
    load will move exists before Prometheus's first scrape (a counter's first sample is
    not counted as an increase by ``rate``)."""
    async with aiohttp.ClientSession() as session:
        replies = [await send(session, base_url, model, tenant) for tenant in TENANTS]
        limited = next(t for t in TENANTS if t.rate is not None)
        replies.append(await send(session, base_url, model, limited))
    return replies


def tally(replies: Sequence[Reply]) -> Counter[tuple[str, str]]:
    """Replies counted by (lane, outcome)."""
    return Counter((reply.lane, reply.outcome) for reply in replies)


def default_load() -> list[tuple[Tenant, float]]:
    """18 requests/s: chat 8/s (interactive), analytics 6/s and limited 4/s (batch, where
    the rate limit of 2/s refuses about half of limited's). At 200 ms each, the ~16/s
    admitted keep ~3.2 of the model's 4 slots busy, and the batch lane's 2 slots ~80%
    busy: short queues form and drain."""
    rates = {"chat": 8.0, "analytics": 6.0, "limited": 4.0}
    return [(tenant, rates[tenant.name]) for tenant in TENANTS]
