"""``kill -9`` of a gateway replica mid-load: its leases expire with its liveness (the
lease TTL) and the surviving replicas take the whole model cap again."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.distributed.cluster import ClusterSpec, ModelSetup, lane, running_cluster
from tests.distributed.load import ClosedLoop, EngineSample, RunningSampler, client

pytestmark = pytest.mark.distributed

CAP = 8
LEASE_TTL_S = 2.0
# Beyond the TTL: the survivors' next sync after the expiry (a request of theirs
# ends every ~60 ms under this load), the engine's abort of the dead replica's
# requests, and the 20 ms sampling.
RECLAIM_SLACK_S = 1.0


def first(samples: list[EngineSample], after: float, test: Callable[[EngineSample], bool]) -> float:
    """The time of the first sample at or after ``after`` that passes ``test``."""
    for sample in samples:
        if sample.at >= after and test(sample):
            return sample.at
    shown = [(round(s.at - after, 3), s.running) for s in samples if s.at >= after]
    raise AssertionError(f"no such sample after the kill: {shown[:100]}")


async def test_killed_replica_slots_return_to_the_others_within_the_lease_ttl(
    tmp_path: Path,
) -> None:
    """3 gateways, cap 8, 18 closed-loop clients (0.5 s requests): kill -9 a gateway
    that runs requests; once the engine has aborted its requests, the engine's running
    count is back at 8 within TTL + 1 s of the kill, carried by the survivors, whose
    requests all succeed; the engine never runs more than 8."""
    model = ModelSetup("m", {"max_concurrency": CAP, "lanes": [lane("shared", 64)]})
    spec = ClusterSpec(models=(model,), lease_ttl_s=LEASE_TTL_S)
    with running_cluster(spec, tmp_path) as cluster:
        async with client(cluster, "m") as c:
            sampler = RunningSampler(c)
            load = ClosedLoop(c, [(g, None) for g in range(3) for _ in range(6)], max_tokens=50)
            sampler.start()
            load.start()
            await asyncio.sleep(2.0)
            running = [(await c.admin_state(g))["models"][0]["running"] for g in range(3)]
            victim = max(range(3), key=lambda g: running[g])
            killed_at = time.monotonic()
            cluster.kill_gateway(victim)
            await asyncio.sleep(LEASE_TTL_S + RECLAIM_SLACK_S + 1.0)
            replies = await load.stop()
            samples = await sampler.stop()
        stats = cluster.engine_stats("m")
        fallbacks = cluster.store_fallbacks()
    assert not any(fallbacks), f"left global mode: {fallbacks}\n{cluster.logs()}"
    assert running[victim] > 0, running
    aborted_before = max(s.aborted_total for s in samples if s.at < killed_at)
    aborted_at = first(samples, killed_at, lambda s: s.aborted_total > aborted_before)
    back_at = first(samples, aborted_at, lambda s: s.running == CAP)
    print(f"engine back at {CAP} running {back_at - killed_at:.2f} s after the kill")
    assert back_at - killed_at <= LEASE_TTL_S + RECLAIM_SLACK_S, back_at - killed_at
    survivors = [r for r in replies if r.gateway != victim]
    assert [r.status for r in survivors] == [200] * len(survivors)
    assert stats["max_running_seen"] <= CAP, stats
