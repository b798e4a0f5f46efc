"""``sluicegate serve --workers N``: N gateway processes on one port that act as one gateway.

The supervisor (this module, the process the command starts) checks the address
up front, makes a private run directory, gives the workers a shared store — the
config's ``store:`` or, with none, a private ``redis-server`` on a unix socket
(``gateway/workers/private_redis.py``) — and starts N workers
(``gateway/workers/worker_process.py``). Each worker binds its own listening socket on
the shared host:port with ``SO_REUSEPORT`` (the kernel spreads connections over
them) and shares every limit through the store under the replica id
``<replica_id or hostname-pid-random>-w<i>``. A worker keeps its id across
restarts: a restarted worker's first resync replaces what its predecessor held
in the store, so a crashed worker's slots come back as soon as it restarts
rather than one lease TTL later.

Supervision: a worker (or the private Redis) that dies is restarted after a
backoff (0.5 s doubling to 30 s, back to 0.5 s once it has run 30 s), logged
once per restart. SIGTERM or SIGINT: SIGTERM to every worker (uvicorn lets
requests finish for up to ``STOP_GRACE_S``), SIGKILL to any still running
``STOP_GRACE_S + 5`` s later, then the Redis is stopped and the run directory
removed; exit code 0. Workers and the Redis get the parent-death signal (Linux
``PR_SET_PDEATHSIG``), so a supervisor killed with ``-9`` leaves none behind; the run
directory it leaves is removed by the next supervisor's start (``gateway/workers/run_dirs.py``).
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Final, Literal

from sluicegate.config import Config, redacted_store
from sluicegate.errors import SluicegateError
from sluicegate.gateway.distributed.siblings import WORKER_ENV
from sluicegate.gateway.workers.private_redis import (
    PrivateRedis,
    PrivateRedisError,
    find_redis_server,
)
from sluicegate.gateway.workers.run_dirs import make_run_dir, remove_stale_run_dirs
from sluicegate.gateway.workers.worker_process import WorkerSpec
from sluicegate.store.keys import default_replica_id

STOP_GRACE_S = 30.0
"""How long stopping workers may take to finish their requests before SIGKILL."""

PRIVATE_STORE_FAILURE: Final[Literal["fail_open"]] = "fail_open"
"""``on_store_failure`` with the private Redis: it fails only if something kills it, the
supervisor restarts it at once, and meanwhile each worker keeps 1/N of every limit
(the gateway as a whole stays within them) rather than refusing every request."""

PRIVATE_STORE_TIMEOUT_MS = 250.0
"""The private Redis's round-trip bound: on a unix socket a round trip takes ~0.1 ms, and
one slower than 50 ms (the default) means the workers saturate the cores Redis shares
with them, not that Redis is gone; falling back then would only cost capacity."""

BACKOFF_MIN_S = 0.5
BACKOFF_MAX_S = 30.0
STABLE_AFTER_S = 30.0
POLL_S = 0.2

_log = logging.getLogger("sluicegate.workers")


class WorkersError(SluicegateError, RuntimeError):
    """``serve --workers`` cannot start; the message says why and what to do."""


def check_address(host: str, port: int) -> int:
    """Raise ``WorkersError`` if ``host:port`` is taken; the port (a free one for 0).

    Bound without ``SO_REUSEPORT``: a listener that has it (another gateway's worker)
    makes this bind fail, where the workers' own binds would silently join it.
    """
    family, kind, proto, _, address = socket.getaddrinfo(
        host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
    )[0]
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(address)
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise WorkersError(f"{host}:{port} is already in use") from None
            raise WorkersError(f"cannot bind {host}:{port}: {exc.strerror}") from None
        return int(probe.getsockname()[1])


@dataclass
class _Child:
    """A supervised process: what to run, when it started, when to start it again."""

    name: str
    process: subprocess.Popen[bytes] | None = None
    started: float = 0.0
    backoff_s: float = BACKOFF_MIN_S
    restart_at: float | None = None


@dataclass
class Supervisor:
    """Runs the workers (and the private Redis) until stopped; see the module docstring."""

    config_path: Path
    count: int
    host: str
    port: int
    store: str
    replica_base: str
    run_dir: Path
    redis: PrivateRedis | None
    grace_s: float = STOP_GRACE_S
    workers: list[_Child] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _redis_retry_at: float | None = None

    def spec(self, index: int) -> WorkerSpec:
        """Worker ``index``'s settings."""
        private = self.redis is not None
        return WorkerSpec(
            index=index,
            count=self.count,
            run_dir=str(self.run_dir),
            config_path=str(self.config_path),
            host=self.host,
            port=self.port,
            store=self.store,
            replica=f"{self.replica_base}-w{index}",
            on_store_failure=PRIVATE_STORE_FAILURE if private else None,
            timeout_ms=PRIVATE_STORE_TIMEOUT_MS if private else None,
            supervisor=os.getpid(),
            grace_s=self.grace_s,
        )

    def _start_worker(self, index: int) -> None:
        child = self.workers[index]
        env = {**os.environ, WORKER_ENV: self.spec(index).to_env()}
        # Its own session: a Ctrl-C reaches only the supervisor, which stops the workers
        # once (a second signal would make uvicorn drop requests instead of finishing them).
        child.process = subprocess.Popen(
            [sys.executable, "-m", "sluicegate.gateway.workers.worker_process"],
            stdin=subprocess.DEVNULL,
            env=env,
            start_new_session=True,
        )
        child.started = time.monotonic()
        child.restart_at = None

    def _request_stop(self, _signum: int, _frame: FrameType | None) -> None:
        self._stop.set()

    def run(self) -> int:
        """Start everything, supervise until SIGTERM/SIGINT, stop everything; exit code 0."""
        previous = {
            sig: signal.signal(sig, self._request_stop) for sig in (signal.SIGTERM, signal.SIGINT)
        }
        try:
            self.workers = [_Child(f"worker {i}") for i in range(self.count)]
            for index in range(self.count):
                self._start_worker(index)
            while not self._stop.wait(POLL_S):
                self._watch()
        finally:
            self._stop_all()
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        return 0

    def _watch(self) -> None:
        """Restart what died, once its backoff has passed."""
        now = time.monotonic()
        for index, child in enumerate(self.workers):
            if child.restart_at is not None:
                if now >= child.restart_at:
                    try:
                        self._start_worker(index)
                    except OSError as exc:  # e.g. out of processes: try again later
                        child.restart_at = now + child.backoff_s
                        _log.warning("%s: %s; trying again", child.name, exc)
                continue
            assert child.process is not None
            code = child.process.poll()
            if code is not None:
                self._schedule_restart(child, code, now)
        if self.redis is not None:
            if self._redis_retry_at is not None:
                if now >= self._redis_retry_at:
                    self._restart_redis(now)
            else:
                code = self.redis.exited()
                if code is not None:
                    _log.warning("private redis-server exited (code %s); restarting it", code)
                    self._restart_redis(now)

    def _restart_redis(self, now: float) -> None:
        """Start the private Redis again; if that fails, try again ``BACKOFF_MIN_S`` later
        (``exited`` no longer sees a Redis that failed to start)."""
        assert self.redis is not None
        try:
            self.redis.start()
        except (PrivateRedisError, OSError) as exc:
            self._redis_retry_at = now + BACKOFF_MIN_S
            _log.warning("%s; trying again in %.1f s", exc, BACKOFF_MIN_S)
        else:
            self._redis_retry_at = None

    def _schedule_restart(self, child: _Child, code: int, now: float) -> None:
        if now - child.started >= STABLE_AFTER_S:
            child.backoff_s = BACKOFF_MIN_S
        child.restart_at = now + child.backoff_s
        pid = child.process.pid if child.process else "?"
        _log.warning(
            "%s (pid %s) %s; restarting it in %.1f s",
            child.name,
            pid,
            _ended(code),
            child.backoff_s,
        )
        child.backoff_s = min(BACKOFF_MAX_S, child.backoff_s * 2)

    def _stop_all(self) -> None:
        """SIGTERM every worker, SIGKILL stragglers, stop the Redis, remove the run dir."""
        running = [c.process for c in self.workers if c.process and c.process.poll() is None]
        for process in running:
            process.terminate()
        deadline = time.monotonic() + self.grace_s + 5.0
        for process in running:
            try:
                process.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                _log.warning("worker pid %d did not stop in time; killing it", process.pid)
                process.kill()
                process.wait()
        if self.redis is not None:
            self.redis.stop()
        shutil.rmtree(self.run_dir, ignore_errors=True)


def _ended(code: int) -> str:
    """How a process ended, from its ``Popen.returncode``."""
    if code < 0:
        with contextlib.suppress(ValueError):
            return f"was killed by {signal.Signals(-code).name}"
        return f"was killed by signal {-code}"
    return f"exited with code {code}"


def _log_to_stderr() -> None:
    if not _log.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("sluicegate supervisor: %(message)s"))
        _log.addHandler(handler)
        _log.setLevel(logging.INFO)
        _log.propagate = False


def run_workers(
    config_path: Path, config: Config, count: int, host: str | None, port: int | None
) -> int:
    """Serve ``config`` (loaded from ``config_path``) with ``count`` (> 1) workers; the
    exit code.

    Raises:
        WorkersError: not Linux, the address is taken, or no store and no
            ``redis-server`` to run one.
    """
    if not sys.platform.startswith("linux"):
        raise WorkersError(
            "--workers needs Linux (SO_REUSEPORT load balancing and the parent-death signal)"
        )
    _log_to_stderr()
    bind_host = host or config.server.host
    bind_port = check_address(bind_host, port if port is not None else config.server.port)
    binary = None if config.shared_store else find_redis_server()
    if not config.shared_store and binary is None:
        raise WorkersError(
            "--workers needs a store the workers share, and the config has none "
            "(store: memory) and there is no redis-server on PATH to start a private one: "
            "set store: redis://host:port/0 (or unix:///path) in the config, or install "
            "redis-server (e.g. apt-get install redis-server)"
        )
    remove_stale_run_dirs()
    run_dir = make_run_dir()
    redis = None if binary is None else PrivateRedis(binary, run_dir)
    try:
        if redis is not None:
            redis.start()
    except PrivateRedisError as exc:
        shutil.rmtree(run_dir, ignore_errors=True)
        raise WorkersError(str(exc)) from None
    store = config.store if redis is None else redis.url
    supervisor = Supervisor(
        config_path=config_path,
        count=count,
        host=bind_host,
        port=bind_port,
        store=store,
        replica_base=config.distributed.replica_id or default_replica_id(),
        run_dir=run_dir,
        redis=redis,
    )
    where = "private redis-server" if redis is not None else redacted_store(store)
    _log.info(
        "%d workers on %s:%d, shared store %s (pid %d)",
        count,
        bind_host,
        bind_port,
        where,
        os.getpid(),
    )
    return supervisor.run()
