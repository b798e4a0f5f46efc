"""A live stack for the Prometheus test: emulated engine, gateway, Kueue exporter, Prometheus.

Every process runs as a real child on a free loopback port in its own session
(``tests/distributed/cluster.py``'s ``Child``): ``sluicegate emulate``,
``sluicegate serve --config FILE`` (distributed mode, on a private ``redis-server``)
and Debian's ``/usr/bin/prometheus`` (``live_prometheus.py``), which scrapes the
engine, the gateway and the exporter every second and evaluates
``deploy/prometheus/rules.yml`` every second. The Kueue exporter is
``prometheus_client``'s own HTTP server in this process, serving
``kueue_pending_workloads`` with a value the test sets.
"""

from __future__ import annotations

import contextlib
import signal
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from prometheus_client import CollectorRegistry, Gauge, start_http_server
from prometheus_client.parser import text_string_to_metric_families

from sluicegate.demo.processes import free_port
from tests.deploy.live_prometheus import SCRAPE_INTERVAL_S, Prometheus, get_json, start_prometheus
from tests.distributed.cluster import Child, spawn, stop_children, wait_ready
from tests.store.redis_server import running_redis

REPO = Path(__file__).resolve().parents[2]
RULES_FILE = REPO / "deploy" / "prometheus" / "rules.yml"
ADMIN_KEY = "live-admin-key"
ADMIN_KEY_ENV = "SG_LIVE_ADMIN_KEY"
PRESSURE_INTERVAL_S = 1.0
PRESSURE_THRESHOLD = 10.0
PRESSURE_CLEAR_BELOW = 5.0
PRESSURE_QUERY = 'sum(kueue_pending_workloads{cluster_queue="gpu"})'


@dataclass(frozen=True)
class Tenant:
    """A configured tenant: its name, lane, key, and rate limit (requests/s, burst)."""

    name: str
    lane: str
    rate: tuple[float, float] | None = None

    @property
    def key(self) -> str:
        """Its API key (the config names the environment variable that holds it)."""
        return f"live-key-{self.name}"

    @property
    def key_env(self) -> str:
        """The environment variable its key is passed in."""
        return f"SG_LIVE_KEY_{self.name.upper()}"


FIRST_LANE = "interactive"
LAST_LANE = "batch"
TENANTS = (
    Tenant("chat", FIRST_LANE),
    Tenant("analytics", LAST_LANE),
    Tenant("limited", LAST_LANE, rate=(2.0, 1.0)),  # about half of its requests are refused (429)
)


class KueueExporter:
    """``kueue_pending_workloads{cluster_queue="gpu", status="inadmissible"}`` on its own
    HTTP server (loopback, free port); ``set`` changes the value it serves."""

    def __init__(self) -> None:
        self.port = free_port()
        registry = CollectorRegistry()
        gauge = Gauge(
            "kueue_pending_workloads",
            "Workloads pending admission (Kueue's name and labels).",
            ["cluster_queue", "status"],
            registry=registry,
        )
        self._pending = gauge.labels("gpu", "inadmissible")
        self._server, self._thread = start_http_server(
            self.port, addr="127.0.0.1", registry=registry
        )

    def set(self, value: float) -> None:
        """Serve ``value`` from now on."""
        self._pending.set(value)

    def close(self) -> None:
        """Stop the HTTP server."""
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)


def gateway_config(
    *, port: int, engine_port: int, model: str, prometheus_url: str, store: str
) -> dict[str, Any]:
    """The gateway's configuration: one model with two lanes (``interactive`` first,
    ``batch`` last) behind a cap of 4, three keyed tenants (one rate-limited), the shared
    ``store`` (distributed mode, so that its metrics exist too), and a ``pressure:``
    section polling ``prometheus_url`` for the Kueue backlog."""

    def lane(name: str, cap: int, slo_ms: int) -> dict[str, Any]:
        return {
            "name": name,
            "max_concurrency": cap,
            "max_queue": 4096,
            "queue_timeout_s": 60,
            "slo_ms": slo_ms,
            "policy": "fifo",
            "preemptible": "never",
        }

    tenants = []
    for tenant in TENANTS:
        entry: dict[str, Any] = {
            "name": tenant.name,
            "api_key_env": tenant.key_env,
            "default_lane": tenant.lane,
            "allowed_lanes": [FIRST_LANE, LAST_LANE],
        }
        if tenant.rate is not None:
            entry["requests_per_s"], entry["burst_requests"] = tenant.rate
        tenants.append(entry)
    backend = {"name": "engine-0", "url": f"http://127.0.0.1:{engine_port}", "engine": "vllm"}
    return {
        "server": {
            "host": "127.0.0.1",
            "port": port,
            "admin_key_env": ADMIN_KEY_ENV,
            "scrape_interval_s": SCRAPE_INTERVAL_S / 2,
        },
        "models": [
            {
                "name": model,
                "backends": [backend],
                "max_concurrency": 4,
                "max_inflight_tokens": "off",
                "lanes": [lane(FIRST_LANE, 4, 10_000), lane(LAST_LANE, 2, 60_000)],
            }
        ],
        "tenants": tenants,
        "store": store,
        # 250 ms, not 50: one slow round trip on a busy 2-core machine is not a store failure.
        "distributed": {"timeout_ms": 250},
        "pressure": {
            "prometheus_url": prometheus_url,
            "interval_s": PRESSURE_INTERVAL_S,
            "timeout_s": PRESSURE_INTERVAL_S,
            "signals": [
                {
                    "name": "kueue_backlog",
                    "query": PRESSURE_QUERY,
                    "threshold": PRESSURE_THRESHOLD,
                    "clear_below": PRESSURE_CLEAR_BELOW,
                }
            ],
        },
    }


@dataclass
class LiveStack:
    """The running stack of one test module."""

    model: str
    engine: Child
    gateway: Child
    exporter: KueueExporter
    prometheus: Prometheus
    config: dict[str, Any]
    restart: Callable[[], Child]
    """Starts the engine again (same port and arguments) after ``kill_engine``."""

    def kill_engine(self) -> None:
        """``kill -9`` the engine's process group and reap it."""
        self.engine.signal_group(signal.SIGKILL)
        self.engine.proc.wait(timeout=10)

    def restart_engine(self) -> None:
        """Start the engine again and wait until the gateway is ready (backend healthy)."""
        self.engine = self.restart()
        wait_ready([(self.engine, "/health"), (self.gateway, "/readyz")])

    @property
    def pressure_queries(self) -> list[str]:
        """The PromQL queries of the gateway config's ``pressure:`` signals."""
        return [signal["query"] for signal in self.config["pressure"]["signals"]]

    def admin_state(self) -> dict[str, Any]:
        """The gateway's ``/admin/state`` (admin key)."""
        state: dict[str, Any] = get_json(
            self.gateway.url + "/admin/state", headers={"Authorization": f"Bearer {ADMIN_KEY}"}
        )
        return state

    def gateway_samples(self, name: str) -> list[tuple[dict[str, str], float]]:
        """Every sample called ``name`` on the gateway's ``/metrics`` now: (labels, value)."""
        with urllib.request.urlopen(self.gateway.url + "/metrics", timeout=5) as response:
            text = response.read().decode()
        return [
            (sample.labels, float(sample.value))
            for family in text_string_to_metric_families(text)
            for sample in family.samples
            if sample.name == name
        ]

    def wait_scraped(self, requests: int, timeout_s: float = 15.0) -> None:
        """Wait until every target is up and Prometheus's ``sum(sluicegate_requests_total)``
        is ``requests``: a scrape has seen every series the requests so far created."""
        self.prometheus.wait_all_up(timeout_s)
        deadline = time.monotonic() + timeout_s
        while (found := self.prometheus.values("sum(sluicegate_requests_total)")) != [requests]:
            if time.monotonic() > deadline:
                raise AssertionError(f"Prometheus counts {found} requests, not {requests}")
            time.sleep(0.1)

    def logs(self) -> str:
        """The end of every child's log, for failure messages."""
        children = (self.engine, self.gateway, self.prometheus.child)
        return "\n".join(f"--- {c.name}\n{c.log_tail()}" for c in children)


@contextlib.contextmanager
def live_stack(log_dir: Path, model: str, jobs: Mapping[str, str]) -> Iterator[LiveStack]:
    """Prometheus, a private Redis, engine, gateway and exporter running; all stopped on exit.

    ``jobs`` maps each scrape target's role (``gateway``, ``engine``, ``kueue``)
    to the job name Prometheus gives it. Prometheus starts first: it scrapes
    nothing for its first ~5 s (its target discovery's update delay), which
    overlaps with the others' start and leaves time for warm-up traffic before its
    first scrape of the gateway (``wait_scraped`` makes sure).
    """
    engine_port, gateway_port, prometheus_port = free_port(), free_port(), free_port()
    env = {ADMIN_KEY_ENV: ADMIN_KEY} | {tenant.key_env: tenant.key for tenant in TENANTS}
    engine_args = ["emulate", "--port", str(engine_port), "--preset", "independent",
                   "--model", model, "--max-num-seqs", "64"]  # fmt: skip
    with contextlib.ExitStack() as cleanup:
        redis = cleanup.enter_context(running_redis())
        exporter = KueueExporter()
        cleanup.callback(exporter.close)
        children: list[Child] = []
        cleanup.callback(stop_children, children)
        targets = {"gateway": gateway_port, "engine": engine_port, "kueue": exporter.port}
        scrape = {job: f"127.0.0.1:{targets[role]}" for role, job in jobs.items()}
        prometheus = start_prometheus(log_dir, prometheus_port, scrape, [RULES_FILE])
        children.append(prometheus.child)
        config = gateway_config(
            port=gateway_port,
            engine_port=engine_port,
            model=model,
            prometheus_url=prometheus.url,
            store=redis.url,
        )
        config_file = log_dir / "gateway.yaml"
        config_file.write_text(yaml.safe_dump(config, sort_keys=False))

        def start_engine() -> Child:
            name = f"engine-{sum(c.name.startswith('engine') for c in children)}"
            engine = spawn(name, engine_args, engine_port, log_dir, {})
            children.append(engine)
            return engine

        engine = start_engine()
        gateway_args = ["serve", "--config", str(config_file)]
        gateway = spawn("gateway", gateway_args, gateway_port, log_dir, env)
        children.append(gateway)
        wait_ready([(engine, "/health"), (gateway, "/readyz")])
        yield LiveStack(model, engine, gateway, exporter, prometheus, config, start_engine)
