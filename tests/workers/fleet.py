"""A real ``sluicegate serve --workers N`` in front of an emulated engine, for the tests.

The supervisor runs in its own session; the process tree under it (workers and
the private ``redis-server``) is read from ``/proc``, so a test can check that
nothing is left behind. The ``Cluster`` it yields is the distributed tests' one
with the supervisor as its only gateway, so ``tests/distributed/load.py``'s
client sends load through the shared port.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import orjson
import yaml

from sluicegate.demo.processes import free_port
from tests.distributed.cluster import (
    ADMIN_KEY,
    ADMIN_KEY_ENV,
    Child,
    Cluster,
    ClusterSpec,
    ModelSetup,
    gateway_config,
    lane,
    spawn,
    stop_children,
    wait_ready,
)

CAP = 4
"""The model cap every fleet runs with."""

MODEL = ModelSetup("m", {"max_concurrency": CAP, "lanes": [lane("shared", 64)]})


def descendants(pid: int) -> list[int]:
    """Every live process under ``pid`` (Linux ``/proc/<pid>/task/*/children``)."""
    found: list[int] = []
    pending = [pid]
    while pending:
        parent = pending.pop()
        for task in Path(f"/proc/{parent}/task").glob("*"):
            with contextlib.suppress(OSError):
                children = [int(c) for c in (task / "children").read_text().split()]
                found += children
                pending += children
    return found


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie counts as gone)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    return "\nState:\tZ" not in status


def run_dir_of(worker: int) -> Path:
    """The supervisor's run directory, read from a worker's environment."""
    environ = Path(f"/proc/{worker}/environ").read_bytes().split(b"\0")
    raw = next(e for e in environ if e.startswith(b"SLUICEGATE_WORKER="))
    return Path(orjson.loads(raw.partition(b"=")[2])["run_dir"])


def wait_until_gone(pids: list[int], timeout_s: float) -> list[int]:
    """Wait until none of ``pids`` runs; those still running after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    return [p for p in pids if alive(p)]


def admin_state(url: str) -> dict[str, Any]:
    """``GET /admin/state`` with the admin key."""
    request = urllib.request.Request(
        url + "/admin/state", headers={"Authorization": f"Bearer {ADMIN_KEY}"}
    )
    with urllib.request.urlopen(request, timeout=5) as response:
        data: dict[str, Any] = orjson.loads(response.read())
    return data


def worker_pids(url: str) -> dict[int, int]:
    """Worker index → pid, from ``/admin/state`` (only workers that answered)."""
    return {w["worker"]: w["pid"] for w in admin_state(url)["workers"] if "pid" in w}


def wait_workers(child: Child, count: int, timeout_s: float = 30.0) -> dict[int, int]:
    """Wait until ``/admin/state`` lists ``count`` answering workers; their pids."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            pids = worker_pids(child.url)
        except urllib.error.HTTPError as exc:
            exc.close()
        except (OSError, KeyError, ValueError):
            pass
        else:
            if len(pids) == count:
                return pids
        if child.proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"{count} workers never answered:\n{child.log_tail()}")
        time.sleep(0.1)


def write_config(
    log_dir: Path, name: str, *, port: int, engine_port: int, store: str = "memory"
) -> Path:
    """A gateway config with model ``m`` (cap ``CAP``) on the engine at ``engine_port``."""
    spec = ClusterSpec(models=(MODEL,), shared_store=store != "memory")
    config = gateway_config(spec, port=port, replica=name, engines={"m": engine_port}, store=store)
    path = log_dir / f"{name}.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def start_engine(log_dir: Path) -> Child:
    """An emulated engine (``independent`` preset: 10 ms per output token)."""
    port = free_port()
    args = ["emulate", "--port", str(port), "--preset", "independent", "--model", "m"]
    args += ["--max-num-seqs", "64"]
    return spawn("engine", args, port, log_dir, {})


def start_supervisor(
    log_dir: Path, config: Path, port: int, workers: int, env: Mapping[str, str] | None = None
) -> Child:
    """``sluicegate serve --workers N`` in its own session."""
    args = ["serve", "--config", str(config), "--workers", str(workers)]
    return spawn("supervisor", args, port, log_dir, {ADMIN_KEY_ENV: ADMIN_KEY, **(env or {})})


@contextlib.contextmanager
def running_fleet(
    log_dir: Path,
    workers: int = 2,
    *,
    server: Mapping[str, object] | None = None,
    env: Mapping[str, str] | None = None,
) -> Iterator[Cluster]:
    """An engine and ``serve --workers N`` in front of it, every worker answering; every
    process (and the supervisor's whole tree) ended on exit. ``server`` settings go into
    the config's ``server:`` section, ``env`` into the supervisor's environment."""
    engine = start_engine(log_dir)
    port = free_port()
    config = write_config(log_dir, "gateway", port=port, engine_port=engine.port)
    if server:
        edited = yaml.safe_load(config.read_text())
        edited["server"].update(server)
        config.write_text(yaml.safe_dump(edited, sort_keys=False))
    supervisor = start_supervisor(log_dir, config, port, workers, env)
    cluster = Cluster(ClusterSpec(models=(MODEL,)), None, {"m": engine}, [supervisor])
    try:
        wait_ready([(engine, "/health"), (supervisor, "/readyz")])
        wait_workers(supervisor, workers)
        yield cluster
    finally:
        tree = descendants(supervisor.proc.pid) if supervisor.proc.poll() is None else []
        stop_children([supervisor, engine])
        for pid in wait_until_gone(tree, 5.0):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
