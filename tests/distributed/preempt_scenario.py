"""The preemption scenario of issue 29, shared by the distributed and ``--workers`` tests.

Model cap 4, lanes ``interactive`` (``preempt_after_ms`` 200, never preemptible) and
``best_effort`` (``preemptible: always``, abort). Tenant ``bg`` (priority 5) fills the
engine with four long best-effort requests; then tenant ``fg`` (priority 0) sends four
short interactive requests. Each waits 200 ms, turns urgent, and a long one is stopped
for it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from tests.distributed.cluster import Cluster, ModelSetup, lane
from tests.distributed.load import Client, Reply, client

CAP = 4
LONG_TOKENS = 400  # 4 s on the ``independent`` preset
SHORT_TOKENS = 5  # 50 ms
PREEMPT_AFTER_MS = 200
MODEL = ModelSetup(
    "m",
    {
        "max_concurrency": CAP,
        "lanes": [
            lane("interactive", CAP, preempt_after_ms=PREEMPT_AFTER_MS),
            lane("best_effort", CAP, preemptible="always", preempt_action="abort"),
        ],
    },
)
TENANTS = (
    {"name": "fg", "default_lane": "interactive", "default_priority": 0},
    {"name": "bg", "default_lane": "best_effort", "default_priority": 5},
)


async def fill_engine(
    c: Client,
    gateways: Sequence[int],
    *,
    tenant: str | None,
    max_tokens: int = LONG_TOKENS,
    settle_s: float = 0.1,
) -> list[asyncio.Task[Reply]]:
    """``CAP`` long requests of ``tenant``, the i-th through ``gateways[i % len]``; returns
    once the engine runs all of them (and ``settle_s`` later, so that they were admitted
    strictly before what the caller sends next). Their tasks, to await."""
    tasks = [
        asyncio.create_task(
            c.send(gateways[i % len(gateways)], tenant=tenant, max_tokens=max_tokens)
        )
        for i in range(CAP)
    ]
    while (await c.engine_stats())["running"] < CAP:
        await asyncio.sleep(0.01)
    await asyncio.sleep(settle_s)
    return tasks


async def preempt_scenario(
    cluster: Cluster, *, bg_gateway: int, fg_gateway: int
) -> tuple[list[Reply], list[Reply], float]:
    """Four long ``bg`` requests through ``bg_gateway``; once the engine runs them, four
    short ``fg`` ones through ``fg_gateway``. Returns both groups' replies and the most
    the engine ran at once."""
    async with client(cluster, "m") as c:
        before = await c.engine_stats()
        longs = await fill_engine(c, [bg_gateway], tenant="bg")
        shorts = await asyncio.gather(
            *(c.send(fg_gateway, tenant="fg", max_tokens=SHORT_TOKENS) for _ in range(CAP))
        )
        long_replies = list(await asyncio.gather(*longs))
        after = await c.engine_stats()
    assert after["max_running_seen"] >= before["max_running_seen"]
    return list(shorts), long_replies, float(after["max_running_seen"])


def cut_short(replies: list[Reply]) -> list[Reply]:
    """The long requests that were stopped: answered (200, with what they had generated,
    ``finish_reason`` ``preempted``) in well under their full length."""
    full_s = LONG_TOKENS * 0.01
    return [r for r in replies if r.status == 200 and r.latency_s < full_s / 2]
