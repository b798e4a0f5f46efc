"""A private ``redis-server`` on a free loopback port, for tests (never the default 6379).

``running_redis()`` starts one and stops it on exit; the ``RedisServer`` it yields
can stop, kill, pause (SIGSTOP), resume (SIGCONT) and restart the server on the
same port, to test what the store does when Redis fails. With ``appendfsync`` it
persists (``appendonly yes``, in its own directory): a restart after a kill loads
what the append-only file kept.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator, Sequence

from sluicegate.gateway.workers.private_redis import answers_ping

__all__ = ["REDIS_SERVER", "RedisServer", "free_port", "running_redis"]

REDIS_SERVER = shutil.which("redis-server") or "/usr/bin/redis-server"
"""The ``redis-server`` binary the tests run (it may be missing: check ``os.path.exists``)."""

_DEFAULT_PORT = 6379
_READY_TIMEOUT_S = 10.0


def free_port() -> int:
    """A free loopback port (never 6379)."""
    while True:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
            probe.bind(("127.0.0.1", 0))
            port = int(probe.getsockname()[1])
        if port != _DEFAULT_PORT:
            return port


class RedisServer:
    """One ``redis-server`` process on ``127.0.0.1:port``, without persistence unless
    ``appendfsync`` (``always``, ``everysec`` or ``no``) turns its append-only file on."""

    def __init__(
        self,
        port: int,
        workdir: str,
        args: Sequence[str] = (),
        *,
        appendfsync: str | None = None,
    ) -> None:
        if port == _DEFAULT_PORT:
            raise ValueError("tests never use Redis's default port 6379")
        self.port = port
        self._workdir = workdir
        self._args = tuple(args)
        self.appendfsync = appendfsync
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """``redis://127.0.0.1:<port>/0``."""
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def running(self) -> bool:
        """Whether the server was started and not stopped or killed since."""
        return self._process is not None

    @property
    def pid(self) -> int:
        """The running server's process id."""
        if self._process is None:
            raise RuntimeError("redis-server is not running")
        return self._process.pid

    def start(self) -> None:
        """Start the server (again) on the same port and wait until it answers PING."""
        if self._process is not None:
            raise RuntimeError("redis-server is already running")
        if not os.path.exists(REDIS_SERVER):
            raise RuntimeError(f"redis-server not found at {REDIS_SERVER}")
        command = [REDIS_SERVER, "--port", str(self.port), "--bind", "127.0.0.1"]
        if self.appendfsync is None:
            command += ["--save", "", "--appendonly", "no", "--dir", self._workdir]
        else:
            command += ["--save", "", "--appendonly", "yes", "--appendfsync", self.appendfsync]
            command += ["--dir", self._workdir]
        command += ["--loglevel", "warning", "--daemonize", "no", *self._args]
        self._process = subprocess.Popen(
            command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        deadline = time.monotonic() + _READY_TIMEOUT_S
        while not answers_ping(self.port):
            if self._process.poll() is not None or time.monotonic() > deadline:
                self._process.kill()
                self._process.wait()
                self._process = None
                raise RuntimeError(f"redis-server did not start on port {self.port}")
            time.sleep(0.01)

    def _end(self, signum: int) -> None:
        process = self._process
        if process is None:
            return
        if signum != signal.SIGKILL:
            os.kill(process.pid, signal.SIGCONT)
        process.send_signal(signum)
        process.wait(timeout=10)
        self._process = None

    def stop(self) -> None:
        """Stop the server (SIGTERM) and wait for it to exit; nothing if it is not running."""
        self._end(signal.SIGTERM)

    def kill(self) -> None:
        """Kill the server (SIGKILL), as a crash would, and wait for it to exit."""
        self._end(signal.SIGKILL)

    def pause(self) -> None:
        """Freeze the server (SIGSTOP): connections open, nothing answered."""
        os.kill(self.pid, signal.SIGSTOP)

    def resume(self) -> None:
        """Unfreeze a paused server (SIGCONT)."""
        os.kill(self.pid, signal.SIGCONT)


@contextlib.contextmanager
def running_redis(
    port: int | None = None, *, args: Sequence[str] = (), appendfsync: str | None = None
) -> Iterator[RedisServer]:
    """Start a ``redis-server`` on ``port`` (a free one by default) with extra command-line
    ``args`` (e.g. ``["--maxmemory", "4mb"]``), persisting with ``appendfsync`` if given;
    kill it on exit (its files go with it)."""
    with tempfile.TemporaryDirectory(prefix="sluicegate-redis-") as workdir:
        port = free_port() if port is None else port
        server = RedisServer(port, workdir, args, appendfsync=appendfsync)
        server.start()
        try:
            yield server
        finally:
            server.kill()
