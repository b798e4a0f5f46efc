"""Virtual token counter fairness across replicas: tenant A reaches the model only
through gw1, tenant B through gw2 and gw3 (twice A's clients); both stay backlogged.

The lane is ``fifo`` with ``fairness: vtc``, model cap 4, every request the same
(the same prompt, ``max_tokens`` 20 with ``ignore_eos``), so each one charges the
same ``c`` = prompt + 2 × 20 tokens (core/fair_queue.py: input weight 1, output
weight 2). While both tenants are backlogged, VTC keeps their weighted counters
within one charge of each other at every admission, so over any window the
tokens admitted to the two differ by at most 2 × c (one charge at each end).
Served tokens are counted from the answers' ``usage`` (prompt + 2 × completion),
for the requests admitted (send time plus the gateway's ``X-Sluicegate-Queue-Ms``)
in a window from the end of a 1 s warm-up to just before the load stopped: both
tenants are backlogged throughout it; the queued requests drained afterwards,
when only one tenant may still be backlogged, do not count. Its endpoints sit in
gaps between clusters of admissions (``quiet_moment``).
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from tests.distributed.cluster import ClusterSpec, ModelSetup, lane, running_cluster
from tests.distributed.load import ClosedLoop, Reply, client, quiet_moment

pytestmark = pytest.mark.distributed

CAP = 4
OUTPUT_TOKENS = 20
CLIENTS_PER_GATEWAY = 8
# Counting starts once both tenants are backlogged: the first grants go to whichever
# tenant's offers reach the store first, and VTC rightly gives no credit for that.
WARM_UP_S = 1.0


async def run_backlogged(tmp_path: Path, *, shared: bool, duration_s: float) -> list[Reply]:
    """A through gw1 only, B through gw2 and gw3: the replies admitted in a window that
    starts after the warm-up and ends before the load stopped ``duration_s`` later."""
    model = ModelSetup(
        "m",
        {"max_concurrency": CAP, "lanes": [lane("shared", CAP, "fifo", fairness="vtc")]},
    )
    tenants = tuple({"name": t, "default_lane": "shared", "weight": 1.0} for t in "AB")
    spec = ClusterSpec(models=(model,), tenants=tenants, shared_store=shared)
    workers = [(0, "A")] * CLIENTS_PER_GATEWAY + [(1, "B"), (2, "B")] * CLIENTS_PER_GATEWAY
    with running_cluster(spec, tmp_path) as cluster:
        async with client(cluster, "m") as c:
            load = ClosedLoop(c, workers, max_tokens=OUTPUT_TOKENS)
            load.start()
            began = time.monotonic()
            await asyncio.sleep(WARM_UP_S + duration_s)
            stopped = time.monotonic()
            replies = await load.stop()
        fallbacks = cluster.store_fallbacks() if shared else []
    assert not any(fallbacks), f"left global mode: {fallbacks}\n{cluster.logs()}"
    assert {r.status for r in replies} == {200}
    admitted = [r.admitted_s for r in replies if r.admitted_s is not None]
    start = quiet_moment(admitted, began + WARM_UP_S, began + WARM_UP_S + 0.3)
    stop = quiet_moment(admitted, stopped - 0.3, stopped)
    return [r for r in replies if r.admitted_s is not None and start <= r.admitted_s <= stop]


async def test_vtc_bound_holds_across_replicas(tmp_path: Path) -> None:
    """With the shared store, A and B are served within 2 × c of each other over
    ~8 s, although B sends through twice as many replicas and clients."""
    replies = await run_backlogged(tmp_path, shared=True, duration_s=8.0)
    charge = max(r.vtc_tokens for r in replies)
    served = {t: sum(r.vtc_tokens for r in replies if r.tenant == t) for t in "AB"}
    print(f"VTC shared store: served {served}, charge {charge}, bound {2 * charge}")
    assert min(served.values()) > 40 * charge, served
    assert abs(served["A"] - served["B"]) <= 2 * charge, (served, charge)


async def test_without_the_shared_store_the_split_follows_the_replicas(tmp_path: Path) -> None:
    """The contrast: three independent gateways (memory store, cap 4 each) give B, on
    two of them, about twice A's tokens: far outside the VTC bound."""
    replies = await run_backlogged(tmp_path, shared=False, duration_s=4.0)
    charge = max(r.vtc_tokens for r in replies)
    served = {t: sum(r.vtc_tokens for r in replies if r.tenant == t) for t in "AB"}
    print(f"independent gateways: served {served}, charge {charge}")
    assert served["B"] >= 1.7 * served["A"], served
    assert served["B"] - served["A"] > 2 * charge, (served, charge)
