"""One worker of ``serve --workers N``: ``python -m sluicegate.gateway.workers.worker_process``.

The supervisor (``gateway/workers/supervisor.py``) starts it with its settings in the
``SLUICEGATE_WORKER`` environment variable (JSON, ``WorkerSpec``). The worker
asks the kernel to stop it when the supervisor dies, reloads the config from its
path, points it at the shared store under its own replica id, binds its own
listening socket on the shared host:port with ``SO_REUSEPORT`` and a private
unix socket for its siblings (``gateway/distributed/siblings.py``), and serves the gateway
on both.
"""

from __future__ import annotations

import os
import signal
import socket
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Literal

import orjson

from sluicegate.config import Config, ConfigError, load_config
from sluicegate.gateway.app import serve
from sluicegate.gateway.distributed.siblings import WORKER_ENV, WorkerTopology
from sluicegate.gateway.workers.private_redis import die_with_parent
from sluicegate.store.store_config import DistributedSpec

CONFIG_ERROR_EXIT = 3
"""A worker's exit code when the config it reloaded is invalid."""


@dataclass(frozen=True, slots=True)
class WorkerSpec:
    """What the supervisor tells one worker.

    Attributes:
        index: the worker's number, 0 … count − 1.
        count: how many workers there are.
        run_dir: the supervisor's private directory.
        config_path: the YAML file, reloaded by the worker.
        host: the shared address (the config's, or ``--host``).
        port: the shared port (resolved: never 0).
        store: the store URL (the config's, or the private Redis's).
        replica: this worker's replica id in the store.
        on_store_failure: for the private Redis only (a configured store keeps its
            ``distributed:`` block).
        timeout_ms: for the private Redis only.
        supervisor: the supervisor's pid (the worker exits when it is gone).
        grace_s: how long a stopping worker lets requests finish.
    """

    index: int
    count: int
    run_dir: str
    config_path: str
    host: str
    port: int
    store: str
    replica: str
    on_store_failure: Literal["fail_open", "fail_closed"] | None
    timeout_ms: float | None
    supervisor: int
    grace_s: float

    def to_env(self) -> str:
        """The JSON the supervisor puts in ``SLUICEGATE_WORKER``."""
        return orjson.dumps(asdict(self)).decode()

    @classmethod
    def from_env(cls, raw: str) -> WorkerSpec:
        """The spec back from ``SLUICEGATE_WORKER``."""
        return cls(**orjson.loads(raw))

    @property
    def topology(self) -> WorkerTopology:
        """This worker's place among its siblings."""
        return WorkerTopology(self.index, self.count, Path(self.run_dir))


def worker_config(config: Config, spec: WorkerSpec) -> Config:
    """``config`` pointed at the shared store under this worker's replica id. With the
    private Redis the workers are the whole fleet: ``expected_replicas`` is their count."""
    if config.shared_store:
        distributed = config.distributed.model_copy(update={"replica_id": spec.replica})
    else:
        distributed = DistributedSpec(
            replica_id=spec.replica,
            on_store_failure=spec.on_store_failure or "fail_open",
            timeout_ms=spec.timeout_ms or DistributedSpec().timeout_ms,
            expected_replicas=spec.count,
        )
    return config.model_copy(update={"store": spec.store, "distributed": distributed})


def shared_listener(host: str, port: int) -> socket.socket:
    """A TCP socket bound to ``host:port`` with ``SO_REUSEPORT``: every worker binds one
    and the kernel spreads new connections over those that listen.

    Not listening yet: uvicorn listens once the app has started, so a worker that is
    (re)starting gets no connections to hold in its backlog meanwhile.
    """
    family, kind, proto, _, address = socket.getaddrinfo(
        host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
    )[0]
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind(address)
    return sock


def private_listener(path: Path) -> socket.socket:
    """A unix socket bound to ``path`` (replacing a dead predecessor's); uvicorn listens."""
    path.unlink(missing_ok=True)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(str(path))
    return sock


def run_worker(spec: WorkerSpec) -> int:
    """Serve as worker ``spec.index`` until told to stop; the exit code."""
    die_with_parent(spec.supervisor, signal.SIGTERM)
    try:
        config = worker_config(load_config(Path(spec.config_path)), spec)
    except ConfigError as exc:
        print(f"worker {spec.index}: {exc}", file=sys.stderr)
        return CONFIG_ERROR_EXIT
    tcp = shared_listener(spec.host, spec.port)
    unix = private_listener(spec.topology.socket_path(spec.index))
    serve(config, sockets=[tcp, unix], graceful_s=spec.grace_s)
    return 0


def main() -> None:
    """Entry point: the spec from ``SLUICEGATE_WORKER``."""
    raw = os.environ.get(WORKER_ENV)
    if not raw:
        sys.exit(f"{WORKER_ENV} is not set: this module is started by `sluicegate serve --workers`")
    sys.exit(run_worker(WorkerSpec.from_env(raw)))


if __name__ == "__main__":
    main()
