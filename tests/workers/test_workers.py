"""``sluicegate serve --workers 2``: two processes on one port that act as one gateway."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import orjson
import pytest
from prometheus_client.parser import text_string_to_metric_families

from sluicegate.demo.processes import free_port
from tests.distributed.cluster import (
    ADMIN_KEY,
    Cluster,
    ClusterSpec,
    spawn,
    stop_children,
    wait_ready,
)
from tests.distributed.load import client
from tests.gateway.gateway_harness import wait_until
from tests.workers.fleet import (
    CAP,
    MODEL,
    admin_state,
    descendants,
    run_dir_of,
    running_fleet,
    start_engine,
    wait_until_gone,
    wait_workers,
    write_config,
)

pytestmark = pytest.mark.workers

BURST = 48
"""Requests sent at once: far more than twice the cap, each 0.2–0.4 s on the engine."""

SIZES = (20, 30, 40)


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """One engine and ``serve --workers 2`` in front of it, for the tests that only read."""
    with running_fleet(tmp_path_factory.mktemp("fleet")) as cluster:
        yield cluster


def samples(text: str, name: str) -> list[tuple[dict[str, str], float]]:
    """Every sample called ``name`` in Prometheus ``text``: (labels, value)."""
    return [
        (dict(sample.labels), float(sample.value))
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == name
    ]


async def test_the_model_cap_holds_across_both_workers(fleet: Cluster) -> None:
    """48 requests at once through the shared port, cap 4: the engine never runs more
    than 4 (and does run 4), every request is answered 200, and both workers took
    some (the kernel spread the connections; the store shared the cap)."""
    async with client(fleet, "m") as c:
        replies = await c.burst(BURST, max_tokens=SIZES)
    stats = fleet.engine_stats("m")
    print(f"2 workers, cap {CAP}: engine max_running_seen {stats['max_running_seen']}")
    assert sorted({r.status for r in replies}) == [200], [r.error_code for r in replies]
    assert stats["max_running_seen"] == CAP, stats
    completed = samples(fleet.metrics(0), "sluicegate_requests_total")
    per_worker = {labels["worker"]: value for labels, value in completed}
    assert set(per_worker) == {"0", "1"}, per_worker
    assert all(value > 0 for value in per_worker.values()), per_worker


async def test_two_gateways_without_a_shared_store_exceed_the_cap(tmp_path: Path) -> None:
    """The contrast: two single-process gateways with the same config (memory store) and
    the same burst split over them let the engine run up to twice the cap."""
    engine = start_engine(tmp_path)
    gateways = []
    for name in ("solo1", "solo2"):
        port = free_port()
        config = write_config(tmp_path, name, port=port, engine_port=engine.port)
        gateways.append(spawn(name, ["serve", "--config", str(config)], port, tmp_path, {}))
    cluster = Cluster(ClusterSpec(models=(MODEL,)), None, {"m": engine}, gateways)
    try:
        wait_ready([(engine, "/health"), *((g, "/readyz") for g in gateways)])
        async with client(cluster, "m") as c:
            replies = await c.burst(BURST, max_tokens=SIZES)
        stats = cluster.engine_stats("m")
    finally:
        stop_children([*gateways, engine])
    print(f"2 independent gateways, cap {CAP} each: max_running_seen {stats['max_running_seen']}")
    assert sorted({r.status for r in replies}) == [200]
    assert stats["max_running_seen"] > CAP, stats


async def test_metrics_show_every_worker(fleet: Cluster) -> None:
    """``/metrics`` on the shared port, whichever worker answers it, is one valid
    exposition with each worker's samples labelled ``worker``: the completions it
    counts add up to what was sent, and ``sluicegate_worker_up`` is 1 for both."""
    before = sum(v for _, v in samples(fleet.metrics(0), "sluicegate_requests_total"))
    async with client(fleet, "m") as c:
        replies = await c.burst(20, max_tokens=(1,))
    assert sorted({r.status for r in replies}) == [200]
    for _ in range(4):  # several scrapes: each may land on either worker
        text = fleet.metrics(0)
        total = sum(v for _, v in samples(text, "sluicegate_requests_total"))
        assert total == before + 20, text
        up = {labels["worker"]: v for labels, v in samples(text, "sluicegate_worker_up")}
        assert up == {"0": 1.0, "1": 1.0}, up
        workers = {labels.get("worker") for labels, _ in samples(text, "sluicegate_queue_depth")}
        assert workers == {"0", "1"}, workers
        assert text.count("# TYPE sluicegate_requests_total ") == 1


def test_admin_state_lists_every_worker(fleet: Cluster) -> None:
    """``/admin/state`` answers for both workers, each in global mode on the shared
    store under its own replica id; without the admin key it is refused."""
    state = admin_state(fleet.gateway_url(0))
    workers = state["workers"]
    assert [w["worker"] for w in workers] == [0, 1], state
    assert len({w["pid"] for w in workers}) == 2
    assert {w["store"]["mode"] for w in workers} == {"global"}
    assert [w["store"]["replica"].rsplit("-", 1)[1] for w in workers] == ["w0", "w1"]
    assert {w["store"]["replicas"] for w in workers} == {2}
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(fleet.gateway_url(0) + "/admin/state", timeout=5)
    refused.value.close()
    assert refused.value.code == 401


async def test_every_workers_view_and_the_global_running_requests_appear(fleet: Cluster) -> None:
    """With three long requests running through the shared port (the kernel picks each one's
    worker), ``/admin/state`` shows each worker's own view of the store (its session, global
    since a moment before, no fallback, a sync under a second old) and, from each, the same
    global running count per tenant (the open gateway's requests are ``other``), while the
    workers' own ``tenants_running`` add up to it; ``/metrics`` says the same per worker."""
    url = fleet.gateway_url(0)
    body = {"model": "m", "prompt": "hold", "max_tokens": 1000, "ignore_eos": True, "stream": True}
    async with aiohttp.ClientSession() as session:
        streams = []
        try:
            for _ in range(3):
                stream = await session.post(url + "/v1/completions", json=body)
                assert stream.status == 200
                await stream.content.readline()
                streams.append(stream)
            held = [{"tenant": "other", "running": 3, "lanes": {"shared": 3}}]

            def global_everywhere() -> bool:
                workers = admin_state(url)["workers"]
                return all(w["store"]["global_tenants"]["models"]["m"] == held for w in workers)

            assert await asyncio.to_thread(wait_until, global_everywhere, 5.0), admin_state(url)
            workers = admin_state(url)["workers"]
            sessions = [w["store"]["session"] for w in workers]
            assert [s.rsplit("-", 1)[1] for s in sessions] == ["w0.1", "w1.1"], sessions
            for worker in workers:
                store = worker["store"]
                assert (store["mode"], store["fallbacks"]) == ("global", 0), store
                assert store["mode_since"] <= worker["time"]
                assert 0.0 <= store["last_sync"]["age_s"] < 1.0, store
            local = [row["running"] for w in workers for row in w["models"][0]["tenants_running"]]
            assert sum(local) == 3, workers
            text = fleet.metrics(0)
            global_gauge = samples(text, "sluicegate_store_global_tenant_running")
            assert sorted((labels["worker"], v) for labels, v in global_gauge) == [
                ("0", 3.0), ("1", 3.0),
            ]  # fmt: skip
            local_gauge = samples(text, "sluicegate_tenant_inflight_requests")
            assert sum(v for _, v in local_gauge) == 3.0, local_gauge
            modes = samples(text, "sluicegate_store_mode")
            assert sorted(
                labels["worker"] for labels, v in modes if labels["mode"] == "global" and v == 1.0
            ) == ["0", "1"]
        finally:
            for stream in streams:
                stream.close()


async def test_a_killed_worker_is_restarted_and_drain_reaches_every_worker(
    tmp_path: Path,
) -> None:
    """``kill -9`` of a worker: the supervisor logs it and starts it again, and requests
    through the shared port all succeed afterwards. ``/admin/drain`` then drains both
    workers, and a worker restarted after the drain comes back draining."""
    with running_fleet(tmp_path) as fleet:
        supervisor = fleet.gateways[0]
        pids = wait_workers(supervisor, 2)
        os.kill(pids[0], signal.SIGKILL)
        deadline = time.monotonic() + 20
        while True:
            now = wait_workers(supervisor, 2)
            if now[0] != pids[0]:
                break
            assert time.monotonic() < deadline, supervisor.log_tail()
            await asyncio.sleep(0.1)
        assert now[1] == pids[1]
        assert "worker 0 (pid" in supervisor.log_tail()
        assert "SIGKILL" in supervisor.log_tail()
        async with client(fleet, "m") as c:
            replies = await c.burst(16, max_tokens=(5,))
            assert sorted({r.status for r in replies}) == [200]
            async with c.session.post(
                fleet.gateway_url(0) + "/admin/drain",
                headers={"Authorization": f"Bearer {ADMIN_KEY}"},
            ) as drained:
                answer = orjson.loads(await drained.read())
            assert drained.status == 200, answer
            assert [w["draining"] for w in answer["workers"]] == [True, True], answer
            os.kill(now[1], signal.SIGKILL)  # restarted after the drain
            await asyncio.sleep(0.2)
            final = wait_workers(supervisor, 2)
            assert final[1] != now[1]
            state = admin_state(fleet.gateway_url(0))
            assert [w["draining"] for w in state["workers"]] == [True, True], state
            refused = await c.burst(4, max_tokens=(1,))
        assert {r.status for r in refused} == {503}


def test_sigterm_stops_every_worker_and_the_redis(tmp_path: Path) -> None:
    """SIGTERM to the supervisor: it exits 0 within a few seconds and leaves no worker,
    no ``redis-server`` and no run directory behind."""
    with running_fleet(tmp_path) as fleet:
        supervisor = fleet.gateways[0]
        tree = descendants(supervisor.proc.pid)
        assert len(tree) == 3, tree  # two workers and the private redis-server
        run_dir = run_dir_of(wait_workers(supervisor, 2)[0])
        assert (run_dir / "redis.sock").exists()
        supervisor.proc.send_signal(signal.SIGTERM)
        assert supervisor.proc.wait(timeout=15) == 0, supervisor.log_tail()
        assert wait_until_gone(tree, 5.0) == [], tree
        assert not run_dir.exists()


def test_supervisor_killed_leaves_no_orphans(tmp_path: Path) -> None:
    """``kill -9`` of the supervisor: its workers and Redis notice (parent-death
    signal) and exit."""
    with running_fleet(tmp_path) as fleet:
        supervisor = fleet.gateways[0]
        tree = descendants(supervisor.proc.pid)
        assert len(tree) == 3, tree
        run_dir = run_dir_of(wait_workers(supervisor, 2)[0])
        supervisor.proc.kill()
        supervisor.proc.wait(timeout=5)
        assert wait_until_gone(tree, 10.0) == [], tree
        shutil.rmtree(run_dir)  # the one thing a killed supervisor leaves behind


def test_no_store_and_no_redis_server_exits_1_with_what_to_do(tmp_path: Path) -> None:
    """With ``store: memory`` and no ``redis-server`` on PATH, ``--workers 2`` exits 1 at
    once and says why and what to do."""
    config = write_config(tmp_path, "g", port=free_port(), engine_port=free_port())
    result = subprocess.run(
        [sys.executable, "-m", "sluicegate", "serve", "-c", str(config), "--workers", "2"],
        env={**os.environ, "PATH": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 1, result
    message = " ".join(result.stderr.split())
    assert "no redis-server on PATH" in message, message
    assert "store: redis://" in message, message
    assert "install redis-server" in message, message
