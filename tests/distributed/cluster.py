"""Real multi-process clusters for the distributed-mode tests.

One private ``redis-server``, one emulated engine per model (``sluicegate emulate``)
and N gateway processes (``sluicegate serve``), each on a free loopback port and
in its own session, so that a test can ``kill -9`` a whole gateway and teardown
can always end every process group, whatever the test did. Each gateway gets its
own config file (its own ``replica_id``); they share the models, tenants and the
store. The client side (sending load, reading the answers) is in ``load.py``.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import yaml
from prometheus_client.parser import text_string_to_metric_families

from sluicegate.demo.processes import free_port
from tests.store.redis_cluster import RedisCluster
from tests.store.redis_server import RedisServer, running_redis

ADMIN_KEY = "distributed-admin-key"
ADMIN_KEY_ENV = "SG_DISTRIBUTED_ADMIN_KEY"
STARTUP_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class ModelSetup:
    """A model of the cluster; it gets its own emulated engine.

    Attributes:
        name: the model name (the engine serves it under the same name).
        settings: the model's config keys besides ``name`` and ``backends``
            (``max_concurrency``, ``lanes``…).
    """

    name: str
    settings: Mapping[str, Any]


@dataclass(frozen=True)
class ClusterSpec:
    """What to start.

    Attributes:
        models: the models, one engine each.
        tenants: ``tenants[]`` entries without ``api_key_env`` (added: the key of
            tenant ``t`` is ``key-t``).
        gateways: gateway processes.
        shared_store: ``store: redis://…`` with a private Redis; else every
            gateway has its own ``store: memory`` (independent replicas).
        on_store_failure: ``fail_open`` or ``fail_closed``.
        lease_ttl_s: the distributed block's lease TTL.
        timeout_ms: the distributed block's Redis timeout. 250 ms, not the 50 ms
            default, except in the store-failure tests (which measure the 50 ms):
            with 50 ms, one round trip delayed by CPU contention on this shared
            2-core machine sends a replica to its fallback, which is not what the
            other tests are about (and each of them asserts that it did not happen).
        engine_preset: the emulators' preset (``independent``: a request takes
            exactly 10 ms per output token, whatever else runs).
        max_num_seqs: the emulators' batch, far above every cap so that only the
            gateways limit concurrency.
        extra: more keys of every gateway's config (``pressure``…); a ``distributed``
            mapping is added to the distributed block.
    """

    models: tuple[ModelSetup, ...]
    tenants: tuple[Mapping[str, Any], ...] = ()
    gateways: int = 3
    shared_store: bool = True
    on_store_failure: str = "fail_open"
    lease_ttl_s: float = 2.0
    timeout_ms: int = 250
    engine_preset: str = "independent"
    max_num_seqs: int = 64
    extra: Mapping[str, Any] = field(default_factory=dict)


def tenant_key(tenant: str) -> str:
    """The API key the cluster gives ``tenant``."""
    return f"key-{tenant}"


def lane(name: str, max_concurrency: int, policy: str = "fifo", **extra: Any) -> dict[str, Any]:
    """A lane with a deep queue and long timeouts, so that only the tested limit rejects."""
    return {
        "name": name,
        "max_concurrency": max_concurrency,
        "max_queue": 4096,
        "queue_timeout_s": 60,
        "slo_ms": 600_000,
        "policy": policy,
        "preemptible": "never",
        **extra,
    }


@dataclass
class Child:
    """A child process in its own session (process group), with its port and log file."""

    name: str
    port: int
    proc: subprocess.Popen[bytes]
    log: Path

    @property
    def url(self) -> str:
        """Its base URL on loopback."""
        return f"http://127.0.0.1:{self.port}"

    def signal_group(self, sig: signal.Signals) -> None:
        """Send ``sig`` to its whole process group (nothing if it is gone)."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, sig)

    def log_tail(self, chars: int = 2000) -> str:
        """The end of its output, for failure messages."""
        return self.log.read_text(errors="replace")[-chars:]


def spawn(
    name: str, args: Sequence[str], port: int, log_dir: Path, env: Mapping[str, str]
) -> Child:
    """Start ``python -m sluicegate ARGS`` in a new session, output to ``log_dir/name.log``."""
    log = log_dir / f"{name}.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "sluicegate", *args],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env={**os.environ, **env},
        )
    return Child(name, port, proc, log)


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=1) as response:
            return bool(response.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def wait_ready(checks: Sequence[tuple[Child, str]], timeout_s: float = STARTUP_TIMEOUT_S) -> None:
    """Wait until every ``child.url + path`` answers 200; raise with its log if one never does."""
    pending = list(checks)
    deadline = time.monotonic() + timeout_s
    while pending:
        child, path = pending[0]
        if _answers(child.url + path):
            pending.pop(0)
            continue
        if child.proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"{child.name} not ready at {path}:\n{child.log_tail()}")
        time.sleep(0.05)


def stop_children(children: Sequence[Child]) -> None:
    """SIGTERM every group, then SIGKILL what is still alive 3 s later."""
    for child in children:
        if child.proc.poll() is None:
            child.signal_group(signal.SIGTERM)
    deadline = time.monotonic() + 3
    for child in children:
        try:
            child.proc.wait(timeout=max(0.05, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            child.signal_group(signal.SIGKILL)
            child.proc.wait()


def gateway_config(
    spec: ClusterSpec, *, port: int, replica: str, engines: Mapping[str, int], store: str
) -> dict[str, Any]:
    """One gateway's configuration (as a dict, dumped to YAML by the caller)."""
    models = [
        {
            "name": model.name,
            "backends": [
                {"name": "e0", "url": f"http://127.0.0.1:{engines[model.name]}", "engine": "vllm"}
            ],
            "max_inflight_tokens": "off",
            **model.settings,
        }
        for model in spec.models
    ]
    tenants = [{**tenant, "api_key_env": f"SG_KEY_{i}"} for i, tenant in enumerate(spec.tenants)]
    config: dict[str, Any] = {
        "server": {
            "host": "127.0.0.1",
            "port": port,
            "admin_key_env": ADMIN_KEY_ENV,
            "scrape_interval_s": 0.5,
        },
        "models": models,
        "store": store,
    }
    if tenants:
        config["tenants"] = tenants
    if store != "memory":
        config["distributed"] = {
            "on_store_failure": spec.on_store_failure,
            "lease_ttl_s": spec.lease_ttl_s,
            "timeout_ms": spec.timeout_ms,
            "replica_id": replica,
        }
    for key, value in spec.extra.items():
        config[key] = {**config[key], **value} if key == "distributed" else value
    return config


@dataclass
class Cluster:
    """The running processes of one test and synchronous probes of them.

    The async client side (load, ``/admin/state``, stats sampling) is ``load.Client``.
    """

    spec: ClusterSpec
    redis: RedisServer | RedisCluster | None
    engines: dict[str, Child] = field(default_factory=dict)
    gateways: list[Child] = field(default_factory=list)

    def gateway_url(self, index: int) -> str:
        """Gateway ``index``'s base URL."""
        return self.gateways[index].url

    def engine_url(self, model: str) -> str:
        """The base URL of the engine serving ``model``."""
        return self.engines[model].url

    def kill_gateway(self, index: int) -> None:
        """``kill -9`` gateway ``index`` (its process group) and reap it."""
        child = self.gateways[index]
        child.signal_group(signal.SIGKILL)
        child.proc.wait(timeout=10)

    def engine_stats(self, model: str) -> dict[str, float]:
        """The engine's ``/emulator/stats`` (``running``, ``max_running_seen``…)."""
        return _get_json(self.engine_url(model) + "/emulator/stats")

    def metrics(self, index: int) -> str:
        """Gateway ``index``'s ``/metrics`` text."""
        request = urllib.request.Request(self.gateway_url(index) + "/metrics")
        with urllib.request.urlopen(request, timeout=5) as response:
            return str(response.read().decode())

    def store_fallbacks(self) -> list[float]:
        """Per live gateway, how often it fell back from global mode (its
        ``sluicegate_store_transitions_total`` into ``on_store_failure``)."""
        mode = self.spec.on_store_failure
        return [
            metric_value(self.metrics(index), "sluicegate_store_transitions_total", mode=mode)
            or 0.0
            for index, gateway in enumerate(self.gateways)
            if gateway.proc.poll() is None
        ]

    def logs(self) -> str:
        """The tail of every gateway's log, for failure messages."""
        return "\n".join(f"--- {g.name}\n{g.log_tail(1500)}" for g in self.gateways)


def metric_value(text: str, name: str, **labels: str) -> float | None:
    """The value of sample ``name`` with ``labels`` in Prometheus ``text`` (``None``: absent)."""
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                return float(sample.value)
    return None


def _get_json(url: str) -> dict[str, Any]:
    with urllib.request.urlopen(url, timeout=5) as response:
        data: dict[str, Any] = orjson.loads(response.read())
    return data


def _start(
    spec: ClusterSpec, log_dir: Path, redis: RedisServer | RedisCluster | None, cluster: Cluster
) -> None:
    env = {ADMIN_KEY_ENV: ADMIN_KEY} | {
        f"SG_KEY_{i}": tenant_key(str(t["name"])) for i, t in enumerate(spec.tenants)
    }
    for model in spec.models:
        port = free_port()
        args = ["emulate", "--port", str(port), "--preset", spec.engine_preset]
        args += ["--model", model.name, "--max-num-seqs", str(spec.max_num_seqs)]
        cluster.engines[model.name] = spawn(f"engine-{model.name}", args, port, log_dir, env)
    engine_ports = {name: child.port for name, child in cluster.engines.items()}
    for index in range(spec.gateways):
        name = f"gw{index + 1}"
        port = free_port()
        store = redis.url if redis is not None else "memory"
        config = gateway_config(spec, port=port, replica=name, engines=engine_ports, store=store)
        path = log_dir / f"{name}.yaml"
        path.write_text(yaml.safe_dump(config, sort_keys=False))
        cluster.gateways.append(spawn(name, ["serve", "--config", str(path)], port, log_dir, env))
    wait_ready(
        [(engine, "/health") for engine in cluster.engines.values()]
        + [(gateway, "/readyz") for gateway in cluster.gateways]
    )


@contextlib.contextmanager
def running_cluster(
    spec: ClusterSpec, log_dir: Path, redis: RedisServer | RedisCluster | None = None
) -> Iterator[Cluster]:
    """Start the cluster, yield it, and end every process on exit, whatever happened.
    The gateways share ``redis`` when given (it may not be running yet), else one started
    here."""
    with contextlib.ExitStack() as stack:
        if redis is None and spec.shared_store:
            redis = stack.enter_context(running_redis())
        cluster = Cluster(spec, redis)
        try:
            _start(spec, log_dir, redis, cluster)
            yield cluster
        finally:
            stop_children([*cluster.gateways, *cluster.engines.values()])
