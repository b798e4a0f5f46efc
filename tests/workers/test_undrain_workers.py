"""``serve --workers 2``: an undrain reaches every worker and removes the drain mark, so a
worker restarted afterwards admits; a ``/metrics`` key holds for the merged exposition."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
import urllib.error
import urllib.request
from pathlib import Path

import orjson
import pytest

from tests.distributed.cluster import ADMIN_KEY
from tests.distributed.load import client
from tests.workers.fleet import admin_state, run_dir_of, running_fleet, wait_workers

pytestmark = pytest.mark.workers

METRICS_KEY_ENV = "SG_TEST_METRICS_KEY"
METRICS_KEY = "workers-metrics-key-canary-1b9d"


def _post(url: str) -> tuple[int, dict[str, object]]:
    request = urllib.request.Request(
        url, method="POST", data=b"", headers={"Authorization": f"Bearer {ADMIN_KEY}"}
    )
    with urllib.request.urlopen(request, timeout=10) as reply:
        return reply.status, orjson.loads(reply.read())


def _metrics_status(url: str, key: str | None) -> tuple[int, str]:
    headers = {} if key is None else {"Authorization": f"Bearer {key}"}
    request = urllib.request.Request(url + "/metrics", headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=10) as reply:
            return reply.status, reply.read().decode()
    except urllib.error.HTTPError as exc:
        with contextlib.closing(exc):
            return exc.code, exc.read().decode()


async def test_undrain_reaches_every_worker_and_survives_a_restart(tmp_path: Path) -> None:
    """Drain, then undrain through the shared port: both workers admit again and the drain
    mark is gone, so a worker killed and restarted after the undrain admits too (before
    this, only a restart of the whole gateway undid a drain). ``/metrics`` with
    ``server.metrics_key_env``: 401 without the key, and with it every worker's samples
    (the fan-out passes the key on to the siblings)."""
    server = {"metrics_key_env": METRICS_KEY_ENV}
    env = {METRICS_KEY_ENV: METRICS_KEY}
    with running_fleet(tmp_path, 2, server=server, env=env) as fleet:
        (supervisor,) = fleet.gateways
        pids = wait_workers(supervisor, 2)
        url = fleet.gateway_url(0)
        mark = run_dir_of(pids[0]) / "draining"

        status, answer = _post(url + "/admin/drain")
        assert (status, answer["draining"]) == (200, True), answer
        assert mark.exists()
        status, answer = _post(url + "/admin/undrain")
        assert status == 200, answer
        assert answer["draining"] is False, answer
        assert [w["draining"] for w in answer["workers"]] == [False, False], answer  # type: ignore[union-attr]
        assert not mark.exists()

        os.kill(pids[1], signal.SIGKILL)
        deadline = time.monotonic() + 20
        while (now := wait_workers(supervisor, 2))[1] == pids[1]:
            assert time.monotonic() < deadline, supervisor.log_tail()
            await asyncio.sleep(0.1)
        state = admin_state(url)
        assert [w["draining"] for w in state["workers"]] == [False, False], state
        async with client(fleet, "m") as c:
            replies = await c.burst(8, max_tokens=(2,))
        assert {r.status for r in replies} == {200}
        assert now[0] == pids[0]

        status, body = _metrics_status(url, None)
        assert status == 401
        assert "invalid_metrics_key" in body
        for _ in range(3):  # each scrape may land on either worker
            status, body = _metrics_status(url, METRICS_KEY)
            assert status == 200
            assert 'sluicegate_worker_up{worker="0"} 1.0' in body, body
            assert 'sluicegate_worker_up{worker="1"} 1.0' in body, body
