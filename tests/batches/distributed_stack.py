"""A distributed batch-lane fleet as real processes: gateway replicas on one private Redis.

One private ``redis-server``, several ``sluicegate emulate`` engines (backends of the one
model) and N ``sluicegate serve`` gateways with ``store: redis://…`` and a ``batches:``
section without ``path``, so that every replica keeps files, batches, lines and results in
the shared Redis. Processes are started and ended with ``tests/distributed/cluster.py``'s
helpers (each in its own session, so that a test can ``kill -9`` a replica); each gateway's
configuration is ``cluster.gateway_config``'s with the engines as backends and the batch
lane added. The client side is the official ``openai`` SDK.
"""

from __future__ import annotations

import contextlib
import signal
import urllib.request
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import openai
import redis
import yaml

from sluicegate.demo.processes import free_port
from tests.batches.process_stack import LANE, MODEL, engines_admitted, start_engines
from tests.distributed.cluster import (
    ADMIN_KEY,
    ADMIN_KEY_ENV,
    Child,
    ClusterSpec,
    ModelSetup,
    gateway_config,
    lane,
    metric_value,
    spawn,
    stop_children,
    tenant_key,
    wait_ready,
)
from tests.store.redis_server import RedisServer, running_redis

KEY_PREFIX = "sluicegate"
"""``distributed.key_prefix`` (the default), under which the batch keys live."""
TENANTS = ("A", "B")


@dataclass(frozen=True)
class FleetSpec:
    """What to start.

    Attributes:
        gateways: gateway replicas.
        engines: emulated engines, each a backend of the model ``m``.
        preset: the engines' preset.
        max_num_seqs: each engine's batch.
        max_concurrency: the model's and its lane's cap (global: the replicas share it).
        batches: the ``batches:`` section (never a ``path``: state is in Redis).
    """

    gateways: int = 3
    engines: int = 2
    preset: str = "instant"
    max_num_seqs: int = 128
    max_concurrency: int = 48
    batches: Mapping[str, Any] = field(
        default_factory=lambda: {"lease_s": 2, "poll_interval_s": 0.2, "max_inflight": 16}
    )


def fleet_config(
    spec: FleetSpec, *, port: int, replica: str, engine_ports: list[int], store: str
) -> dict[str, Any]:
    """One replica's configuration: ``cluster.gateway_config`` for the model (a deep
    ``best_effort`` lane, tenants A and B), every engine as a backend, and the batch lane."""
    cluster = ClusterSpec(
        models=(
            ModelSetup(
                MODEL,
                {
                    "max_concurrency": spec.max_concurrency,
                    "lanes": [lane(LANE, spec.max_concurrency, max_queue=100_000)],
                },
            ),
        ),
        tenants=tuple({"name": t, "default_lane": LANE} for t in TENANTS),
    )
    config = gateway_config(
        cluster, port=port, replica=replica, engines={MODEL: engine_ports[0]}, store=store
    )
    config["models"][0]["backends"] = [
        {"name": f"e{i}", "url": f"http://127.0.0.1:{p}", "engine": "vllm"}
        for i, p in enumerate(engine_ports)
    ]
    config["batches"] = dict(spec.batches)
    return config


@dataclass
class Fleet:
    """The running processes of one test, and synchronous probes of them."""

    spec: FleetSpec
    redis: RedisServer
    engines: list[Child]
    gateways: list[Child]

    def client(self, index: int, tenant: str = "A") -> openai.OpenAI:
        """An official SDK client of replica ``index`` as ``tenant`` (no retries)."""
        return openai.OpenAI(
            base_url=self.gateways[index].url + "/v1",
            api_key=tenant_key(tenant),
            max_retries=0,
            timeout=60,
        )

    def kill_gateway(self, index: int) -> None:
        """``kill -9`` replica ``index`` (its process group) and reap it."""
        child = self.gateways[index]
        child.signal_group(signal.SIGKILL)
        child.proc.wait(timeout=10)

    def alive(self) -> list[int]:
        """The indexes of the replicas still running."""
        return [i for i, g in enumerate(self.gateways) if g.proc.poll() is None]

    def engine_admitted(self) -> int:
        """Requests the engines admitted in all (each run of a line counts once)."""
        return engines_admitted(self.engines)

    def line_runs(self, index: int, outcome: str = "completed") -> int:
        """Runs of batch lines replica ``index`` ended with ``outcome`` (its
        ``sluicegate_batch_line_runs_total``)."""
        url = self.gateways[index].url + "/metrics"
        with urllib.request.urlopen(url, timeout=5) as response:
            text = response.read().decode()
        value = metric_value(text, "sluicegate_batch_line_runs_total", model=MODEL, outcome=outcome)
        return int(value or 0)

    def held_lines(self, batch_id: str, index: int) -> int:
        """Lines of ``batch_id`` the store says replica ``index``'s runner holds (claimed,
        no result yet): its owner name holds the server process's pid."""
        pid = self.gateways[index].proc.pid
        client = redis.Redis.from_url(self.redis.url)
        try:
            owners = client.hvals(f"{{{KEY_PREFIX}:batch}}:own:{batch_id}")
        finally:
            client.close()
        return sum(1 for owner in owners if f"-{pid}-".encode() in owner)

    def logs(self) -> str:
        """The tail of every gateway's log, for failure messages."""
        return "\n".join(f"--- {g.name}\n{g.log_tail(1500)}" for g in self.gateways)


@contextlib.contextmanager
def running_fleet(spec: FleetSpec, log_dir: Path) -> Iterator[Fleet]:
    """Start Redis, the engines and the replicas; end every process on exit, whatever the
    test did."""
    env = {ADMIN_KEY_ENV: ADMIN_KEY} | {
        f"SG_KEY_{i}": tenant_key(tenant) for i, tenant in enumerate(TENANTS)
    }
    with running_redis() as server:
        engines: list[Child] = []
        gateways: list[Child] = []
        try:
            start_engines(engines, spec.engines, spec.preset, spec.max_num_seqs, log_dir)
            for index in range(spec.gateways):
                name = f"gw{index + 1}"
                port = free_port()
                config = fleet_config(
                    spec,
                    port=port,
                    replica=name,
                    engine_ports=[e.port for e in engines],
                    store=server.url,
                )
                path = log_dir / f"{name}.yaml"
                path.write_text(yaml.safe_dump(config, sort_keys=False))
                args = ["serve", "--config", str(path)]
                gateways.append(spawn(name, args, port, log_dir, env))
            wait_ready([(gateway, "/readyz") for gateway in gateways])
            yield Fleet(spec, server, engines, gateways)
        finally:
            stop_children([*gateways, *engines])
