"""One pressure poller per fleet (DESIGN §16): three gateways on one Redis, each with a
``pressure:`` section polling a real Prometheus, which scrapes a Kueue backlog the test sets
(``tests/deploy/live_stack.py``'s exporter).

Prometheus counts the queries it answers (its own ``prometheus_http_requests_total`` of
``/api/v1/query``; the test never queries it), so the test counts how often the fleet
polled: once per interval, not once per gateway. The followers apply the holder's stage;
when the holder is killed with -9 another gateway takes its lease over within one lease
(3 intervals) and goes on from the same stage; with Redis gone every gateway polls on its
own, and with Redis back one does again.
"""

from __future__ import annotations

import contextlib
import signal
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import orjson
import pytest
import redis
from prometheus_client.parser import text_string_to_metric_families

from sluicegate.demo.processes import free_port
from sluicegate.store.pressure_lease import pressure_keys
from tests.deploy.live_prometheus import Prometheus, start_prometheus
from tests.deploy.live_stack import KueueExporter
from tests.distributed.cluster import (
    ADMIN_KEY,
    Cluster,
    ClusterSpec,
    ModelSetup,
    lane,
    metric_value,
    running_cluster,
)

pytestmark = pytest.mark.distributed

_T = TypeVar("_T")
INTERVAL_S = 0.5
LEASE_S = 3 * INTERVAL_S
POLL_TIMEOUT_S = 0.4
THRESHOLD, CLEAR_BELOW = 10.0, 5.0
HIGH, LOW = 20.0, 0.0
QUERY = 'sum(kueue_pending_workloads{cluster_queue="gpu"})'
WINDOW_S = 6.0
# One poller runs a query at most every interval (a step takes longer than none); three
# would run about three times as many. The slack covers a poll caught at each end.
ONE_POLLER_MAX = WINDOW_S / INTERVAL_S + 2


@contextlib.contextmanager
def pressure_fleet(log_dir: Path) -> Iterator[tuple[Cluster, Prometheus, KueueExporter]]:
    """Exporter (backlog ``HIGH``), Prometheus scraping it, and three gateways polling it."""
    exporter = KueueExporter()
    try:
        exporter.set(HIGH)
        prometheus = start_prometheus(
            log_dir, free_port(), {"kueue": f"127.0.0.1:{exporter.port}"}, []
        )
        try:
            prometheus.wait_all_up()
            pressure = {
                "prometheus_url": prometheus.url,
                "interval_s": INTERVAL_S,
                "timeout_s": POLL_TIMEOUT_S,
                "signals": [
                    {
                        "name": "backlog",
                        "query": QUERY,
                        "threshold": THRESHOLD,
                        "clear_below": CLEAR_BELOW,
                    }
                ],
            }
            # Two lanes: the last one (batch) is tightened at stage 1, the highest.
            lanes = [lane("interactive", 4), lane("batch", 4)]
            model = ModelSetup("m", {"max_concurrency": 4, "lanes": lanes})
            spec = ClusterSpec(models=(model,), extra={"pressure": pressure})
            with running_cluster(spec, log_dir) as cluster:
                yield cluster, prometheus, exporter
        finally:
            prometheus.stop()
    finally:
        exporter.close()


def queries_answered(prometheus: Prometheus) -> float:
    """How many ``/api/v1/query`` requests Prometheus has answered (any status)."""
    with urllib.request.urlopen(prometheus.url + "/metrics", timeout=5) as response:
        text = response.read().decode()
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "prometheus_http_requests_total"
        and sample.labels.get("handler") == "/api/v1/query"
    )


def pressure_state(cluster: Cluster, index: int) -> dict[str, Any]:
    """Gateway ``index``'s ``/admin/state`` ``pressure`` object."""
    request = urllib.request.Request(
        cluster.gateway_url(index) + "/admin/state",
        headers={"Authorization": f"Bearer {ADMIN_KEY}"},
    )
    with urllib.request.urlopen(request, timeout=5) as response:
        state: dict[str, Any] = orjson.loads(response.read())["pressure"]
    return state


def live(cluster: Cluster) -> list[int]:
    """The gateways still running."""
    return [i for i, g in enumerate(cluster.gateways) if g.proc.poll() is None]


def polling(cluster: Cluster) -> list[int]:
    """The live gateways whose ``sluicegate_pressure_poller`` is 1."""
    return [
        i for i in live(cluster) if metric_value(cluster.metrics(i), "sluicegate_pressure_poller")
    ]


def stages(cluster: Cluster) -> list[int]:
    """Each live gateway's pressure stage."""
    return [pressure_state(cluster, i)["stage"] for i in live(cluster)]


def wait_for(found: Callable[[], _T | None], timeout_s: float, what: str, cluster: Cluster) -> _T:
    """Call ``found`` every 0.1 s until it returns something; fail naming ``what``."""
    deadline = time.monotonic() + timeout_s
    while True:
        result = found()
        if result is not None:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"no {what} within {timeout_s} s\n{cluster.logs()}")
        time.sleep(0.1)


def wait_until(holds: Callable[[], bool], timeout_s: float, what: str, cluster: Cluster) -> None:
    """Wait until ``holds()`` is true; fail naming ``what``."""
    wait_for(lambda: True if holds() else None, timeout_s, what, cluster)


def one_poller(cluster: Cluster) -> str | None:
    """The replica id of the gateway that polls, if exactly one does and every other live
    one follows it."""
    found = polling(cluster)
    if len(found) != 1:
        return None
    holder = f"gw{found[0] + 1}"
    for index in live(cluster):
        poller = pressure_state(cluster, index)["poller"]
        role = "holder" if index == found[0] else "follower"
        if poller["role"] != role or poller["holder"] != holder:
            return None
    return holder


def count_queries(prometheus: Prometheus, window_s: float) -> float:
    """The queries Prometheus answered during the next ``window_s``."""
    before = queries_answered(prometheus)
    time.sleep(window_s)
    return queries_answered(prometheus) - before


def test_one_gateway_polls_the_others_follow_and_a_killed_poller_is_replaced(
    tmp_path: Path,
) -> None:
    """One of three gateways polls (one query per interval reaches Prometheus, not three);
    all three apply its stage, up and down; killed with -9, it is replaced within one lease
    and the stage never drops meanwhile."""
    with pressure_fleet(tmp_path) as (cluster, prometheus, exporter):
        holder = wait_for(lambda: one_poller(cluster), 10.0, "single poller", cluster)
        wait_until(lambda: stages(cluster) == [1, 1, 1], 5.0, "stage 1 everywhere", cluster)
        queries = count_queries(prometheus, WINDOW_S)
        print(f"3 gateways, {WINDOW_S:g} s at interval {INTERVAL_S:g} s: {queries:g} queries")
        assert WINDOW_S / (INTERVAL_S + POLL_TIMEOUT_S) - 1 <= queries <= ONE_POLLER_MAX, queries
        assert one_poller(cluster) == holder
        follower_state = pressure_state(cluster, int(holder.removeprefix("gw")) % 3)
        assert follower_state["signals"][0]["value"] == HIGH, follower_state
        assert (follower_state["up"], follower_state["status"]) == (True, "ok"), follower_state

        exporter.set(LOW)
        wait_until(lambda: stages(cluster) == [0, 0, 0], 6.0, "stage 0 everywhere", cluster)
        exporter.set(HIGH)
        wait_until(lambda: stages(cluster) == [1, 1, 1], 6.0, "stage 1 again", cluster)

        cluster.kill_gateway(int(holder.removeprefix("gw")) - 1)
        killed = time.monotonic()
        seen: list[list[int]] = []

        def replaced() -> str | None:
            seen.append(stages(cluster))
            new = one_poller(cluster)
            return None if new == holder else new

        successor = wait_for(replaced, LEASE_S + 5.0, "new poller", cluster)
        took_over_s = time.monotonic() - killed
        print(f"{holder} killed: {successor} polls {took_over_s:.2f} s later")
        assert took_over_s <= LEASE_S + 2 * INTERVAL_S + POLL_TIMEOUT_S + 1.0, took_over_s
        assert all(sample == [1, 1] for sample in seen), seen
        queries = count_queries(prometheus, WINDOW_S)
        assert queries <= ONE_POLLER_MAX, queries
        assert one_poller(cluster) == successor
        assert stages(cluster) == [1, 1]


def test_with_the_store_gone_every_gateway_polls_and_one_again_once_it_is_back(
    tmp_path: Path,
) -> None:
    """Redis killed: each gateway polls Prometheus on its own (as without a store) and keeps
    the stage; Redis back (empty): a single poller again, and when it stops (SIGTERM) its
    lease is gone as it exits, not a lease later."""
    with pressure_fleet(tmp_path) as (cluster, prometheus, _):
        wait_for(lambda: one_poller(cluster), 10.0, "single poller", cluster)
        wait_until(lambda: stages(cluster) == [1, 1, 1], 5.0, "stage 1 everywhere", cluster)
        assert cluster.redis is not None
        cluster.redis.kill()
        wait_until(lambda: polling(cluster) == [0, 1, 2], 5.0, "every gateway polling", cluster)
        roles = [pressure_state(cluster, i)["poller"]["role"] for i in range(3)]
        assert roles == ["local"] * 3, roles
        queries = count_queries(prometheus, WINDOW_S)
        print(f"store down: {queries:g} queries in {WINDOW_S:g} s")
        assert queries > ONE_POLLER_MAX, queries
        assert stages(cluster) == [1, 1, 1]

        cluster.redis.start()
        holder = wait_for(lambda: one_poller(cluster), 10.0, "single poller again", cluster)
        assert stages(cluster) == [1, 1, 1]

        stopping = cluster.gateways[int(holder.removeprefix("gw")) - 1]
        stopping.signal_group(signal.SIGTERM)
        stopping.proc.wait(timeout=30)
        with redis.Redis.from_url(cluster.redis.url) as client:
            assert client.get(pressure_keys("sluicegate")[0]) != holder.encode()
