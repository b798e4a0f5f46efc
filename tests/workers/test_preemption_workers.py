"""Preemption under ``serve --workers 2``: the workers are replicas of one private Redis, so an
urgent request at one worker stops a background request running through another, as one
process would (``tests/distributed/preempt_scenario.py``)."""

from __future__ import annotations

import asyncio
import statistics
from pathlib import Path

import pytest
import yaml

from sluicegate.demo.processes import free_port
from tests.distributed.cluster import (
    Cluster,
    ClusterSpec,
    gateway_config,
    running_cluster,
    stop_children,
    tenant_key,
    wait_ready,
)
from tests.distributed.preempt_scenario import CAP, MODEL, TENANTS, cut_short, preempt_scenario
from tests.workers.fleet import start_engine, start_supervisor, wait_workers

pytestmark = pytest.mark.workers


def test_an_urgent_request_at_one_worker_preempts_a_victim_at_another(tmp_path: Path) -> None:
    """Four long best-effort requests and then four urgent interactive ones through the one
    port of two workers (the kernel spreads the connections): the four long ones are
    stopped for them and the interactive latency is within 1.25× of one process's."""
    spec = ClusterSpec(models=(MODEL,), tenants=TENANTS, gateways=1, shared_store=False)
    (tmp_path / "single").mkdir()
    with running_cluster(spec, tmp_path / "single") as single:
        reference, _, _ = asyncio.run(preempt_scenario(single, bg_gateway=0, fg_gateway=0))
    single_s = statistics.median(r.latency_s for r in reference)
    log_dir = tmp_path / "workers"
    log_dir.mkdir()
    engine = start_engine(log_dir)
    port = free_port()
    config = gateway_config(
        spec, port=port, replica="gw", engines={"m": engine.port}, store="memory"
    )
    path = log_dir / "gateway.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    env = {f"SG_KEY_{i}": tenant_key(str(t["name"])) for i, t in enumerate(TENANTS)}
    supervisor = start_supervisor(log_dir, path, port, 2, env)
    try:
        wait_ready([(engine, "/health"), (supervisor, "/readyz")])
        wait_workers(supervisor, 2)
        fleet = Cluster(spec, None, {"m": engine}, [supervisor])
        shorts, longs, most = asyncio.run(preempt_scenario(fleet, bg_gateway=0, fg_gateway=0))
    finally:
        stop_children([supervisor, engine])
    latency = statistics.median(r.latency_s for r in shorts)
    print(f"--workers 2: interactive e2e {latency:.3f} s, one process {single_s:.3f} s")
    assert [r.status for r in shorts] == [200] * CAP
    assert len(cut_short(longs)) == CAP, [(r.status, r.latency_s) for r in longs]
    assert most <= CAP
    assert latency <= 1.25 * single_s, (latency, single_s)
