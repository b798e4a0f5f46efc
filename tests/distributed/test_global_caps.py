"""Global limits across three gateway replicas sharing one Redis: the model cap and a
tenant's request rate (the race for the last slot: ``test_last_slot.py``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.distributed.cluster import ClusterSpec, ModelSetup, lane, running_cluster
from tests.distributed.load import client

pytestmark = pytest.mark.distributed


def capped_model(cap: int) -> ModelSetup:
    """Model ``m`` with ``max_concurrency: cap`` and one roomy FIFO lane."""
    return ModelSetup("m", {"max_concurrency": cap, "lanes": [lane("shared", 64)]})


async def test_burst_at_three_gateways_never_exceeds_the_model_cap(tmp_path: Path) -> None:
    """120 requests (0.3-0.6 s each) at once over 3 gateways with cap 8: the engine
    never runs more than 8, does run 8 (the cap is used, not starved), and every
    request is answered 200."""
    spec = ClusterSpec(models=(capped_model(8),))
    with running_cluster(spec, tmp_path) as cluster:
        async with client(cluster, "m") as c:
            replies = await c.burst(120, max_tokens=(30, 45, 60))
        stats = cluster.engine_stats("m")
        fallbacks = cluster.store_fallbacks()
    assert not any(fallbacks), f"left global mode: {fallbacks}\n{cluster.logs()}"
    print(f"cap 8: engine max_running_seen {stats['max_running_seen']}, 120 answered")
    statuses = sorted({r.status for r in replies})
    assert statuses == [200], (statuses, [r.error_code for r in replies if r.status != 200])
    assert stats["max_running_seen"] == 8, stats
    assert stats["finished_total"] == 120, stats


async def test_tenant_sending_five_times_its_rate_gets_at_most_its_rate(tmp_path: Path) -> None:
    """A tenant limited to 20 req/s (burst 2) sends 100 req/s for 5 s, round-robin over
    3 gateways: at most 1.05 × (20 × span + 2) are admitted, at least 0.9 × 20 × span
    (the global bucket is not starved), and every refusal is a 429 with
    ``Retry-After`` (whole seconds, ≥ 1) and ``retry-after-ms`` (> 0)."""
    rate, burst = 20.0, 2
    spec = ClusterSpec(
        models=(capped_model(64),),
        tenants=(
            {
                "name": "t",
                "requests_per_s": rate,
                "burst_requests": burst,
                "default_lane": "shared",
            },
        ),
    )
    with running_cluster(spec, tmp_path) as cluster:
        async with client(cluster, "m") as c:
            replies = await c.open_loop(5 * rate, 5.0, tenant="t")
        fallbacks = cluster.store_fallbacks()
    assert not any(fallbacks), f"left global mode: {fallbacks}\n{cluster.logs()}"
    span = max(r.started_s for r in replies) - min(r.started_s for r in replies)
    admitted = sum(r.status == 200 for r in replies)
    refused = [r for r in replies if r.status != 200]
    bound = 1.05 * (rate * span + burst)
    print(f"rate: {admitted} of {len(replies)} admitted in {span:.2f} s (bound {bound:.1f})")
    assert {(r.status, r.error_code) for r in refused} == {(429, "rate_limit_exceeded")}
    assert admitted <= bound, (admitted, span)
    assert admitted >= 0.9 * rate * span, (admitted, span)
    for reply in refused:
        assert int(reply.headers["retry-after"]) >= 1, reply.headers
        assert int(reply.headers["retry-after-ms"]) > 0, reply.headers
