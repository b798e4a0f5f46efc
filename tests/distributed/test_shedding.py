"""Shedding across three gateway replicas sharing one Redis: each replica's start estimate
counts the work queued and running at the others (work summaries, DESIGN §16), so a
burst at one replica makes every replica shed, with the same ``Retry-After``."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import orjson
import pytest

from tests.distributed.cluster import ClusterSpec, ModelSetup, lane, running_cluster
from tests.distributed.load import PROMPT, Client, client

pytestmark = pytest.mark.distributed

SLOTS = 4
TOKENS = 50
"""Every request's output: 0.5 s on the ``independent`` engine (10 ms per token)."""
BURST = 40
"""A burst of 40 × 0.5 s over 4 slots: about 5 s of work."""
AGREEMENT_S = 0.5
"""How far the replicas' estimates may differ: a summary is at most one period (0.1 s)
plus a round trip old, and the lane drains 1 s of wait per second (4 slots, 4 running),
so 0.1-0.2 s; the rest is margin for this loaded 2-core machine's event-loop lag."""
SHEDDING = ModelSetup(
    "m",
    {
        "max_concurrency": SLOTS,
        # Predictions right from the start (the engine: 10 ms per token, prefill ~0):
        # every replica predicts 0.5 s per request before any completion teaches it.
        "prior_output_tokens": 1000,
        "prior_decode_tokens_per_s": 100.0,
        "prior_prefill_tokens_per_s": 1_000_000.0,
        "lanes": [lane("chat", SLOTS, shed_hopeless=True)],
    },
)


async def _ask(c: Client, gateway: int, deadline_ms: float) -> tuple[int, str, float, float]:
    """One request with an ``X-Sluicegate-Deadline-Ms``: (status, error code, its
    ``retry-after-ms`` in seconds (0 if none), seconds until the answer)."""
    body = {
        "model": c.model,
        "messages": [{"role": "user", "content": PROMPT}],
        "max_tokens": TOKENS,
        "ignore_eos": True,
    }
    headers = {"Content-Type": "application/json", "X-Sluicegate-Deadline-Ms": str(deadline_ms)}
    started = time.monotonic()
    url = c.cluster.gateway_url(gateway) + "/v1/chat/completions"
    async with c.session.post(url, data=orjson.dumps(body), headers=headers) as response:
        data = orjson.loads(await response.read())
        retry_s = float(response.headers.get("retry-after-ms", 0)) / 1000
        code = "" if response.status == 200 else str(data["error"]["code"])
        return response.status, code, retry_s, time.monotonic() - started


async def test_a_burst_at_one_replica_makes_every_replica_shed_alike(tmp_path: Path) -> None:
    """Idle, replica B keeps a request due in 2 s. Then 40 requests (5 s of work for the
    lane's 4 slots) reach replica A only; 0.4 s later the same request at A, B and C is
    refused at once by each (503 ``overloaded``, not at its latest start) with
    ``Retry-After`` values within ``AGREEMENT_S`` of each other, about the 4.5 s of work
    left per slot. Once the burst has run, B keeps it again."""
    spec = ClusterSpec(models=(SHEDDING,))
    with running_cluster(spec, tmp_path) as cluster:
        async with client(cluster, "m") as c:
            assert (await _ask(c, 1, 2000))[0] == 200
            burst = [asyncio.create_task(c.send(0, max_tokens=TOKENS)) for _ in range(BURST)]
            await asyncio.sleep(0.4)
            probes = await asyncio.gather(*(_ask(c, g, 2000) for g in range(3)))
            replies = await asyncio.gather(*burst)
            after = await _ask(c, 1, 2000)
        fallbacks = cluster.store_fallbacks()
    print("probes (status, code, retry s, answered in s):", probes)
    assert not any(fallbacks), f"left global mode: {fallbacks}\n{cluster.logs()}"
    assert [r.status for r in replies] == [200] * BURST
    for status, code, _, answered_s in probes:
        assert (status, code) == (503, "overloaded"), probes
        assert answered_s < 1.0, probes  # refused on arrival, not at its latest start (1.5 s)
    waits = [retry_s for _, _, retry_s, _ in probes]
    assert max(waits) - min(waits) <= AGREEMENT_S, waits
    assert min(waits) >= 3.0, waits
    assert max(waits) <= 5.5, waits
    assert after[0] == 200, after
