"""The private ``redis-server`` of ``serve --workers N`` when the config names no store.

It listens only on a unix socket in the supervisor's run directory (mode 0700, so
only the gateway's user reaches it; ``--port 0``: no TCP), keeps nothing on disk
(``--save '' --appendonly no``) and dies with the supervisor: it is started with
the parent-death signal (Linux ``PR_SET_PDEATHSIG``), so a supervisor killed with
``-9`` leaves no Redis behind.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from sluicegate.errors import SluicegateError

READY_TIMEOUT_S = 10.0
STOP_TIMEOUT_S = 5.0
_PR_SET_PDEATHSIG = 1


class PrivateRedisError(SluicegateError, RuntimeError):
    """The private Redis cannot run (not installed, or it would not start)."""


def find_redis_server() -> str | None:
    """The ``redis-server`` on ``PATH``, or ``None``."""
    return shutil.which("redis-server")


def die_with_parent(parent: int, sig: signal.Signals = signal.SIGTERM) -> None:
    """Ask the kernel to send ``sig`` to this process when its parent dies (Linux), and
    exit now if ``parent`` is already gone (it died before the request took effect)."""
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
    if os.getppid() != parent:
        os._exit(1)


def _pdeathsig_hook(parent: int) -> Callable[[], None]:
    def hook() -> None:
        die_with_parent(parent)

    return hook


def answers_ping(address: Path | int) -> bool:
    """Whether a Redis listens at ``address`` (a unix socket's path, or a port on
    127.0.0.1) and answers ``PING``."""
    family, where = (
        (socket.AF_UNIX, str(address)) if isinstance(address, Path) else
        (socket.AF_INET, ("127.0.0.1", address))
    )  # fmt: skip
    try:
        with socket.socket(family, socket.SOCK_STREAM) as conn:
            conn.settimeout(0.5)
            conn.connect(where)
            conn.sendall(b"PING\r\n")
            return conn.recv(16).startswith(b"+PONG")
    except OSError:
        return False


class PrivateRedis:
    """One ``redis-server`` on ``<run_dir>/redis.sock``; ``start`` again after it died."""

    def __init__(self, binary: str, run_dir: Path) -> None:
        self.binary = binary
        self.run_dir = run_dir
        self.socket_path = run_dir / "redis.sock"
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """The store URL the workers use: ``unix://<run_dir>/redis.sock``."""
        return f"unix://{self.socket_path}"

    def start(self) -> None:
        """Start it and wait until it answers ``PING``.

        Raises:
            PrivateRedisError: it exited or did not answer within ``READY_TIMEOUT_S``.
        """
        command = [self.binary, "--port", "0", "--unixsocket", str(self.socket_path)]
        command += ["--unixsocketperm", "700", "--save", "", "--appendonly", "no"]
        command += ["--dir", str(self.run_dir), "--loglevel", "warning", "--daemonize", "no"]
        # Its own session: a Ctrl-C meant for the supervisor does not stop it under
        # the draining workers; the supervisor stops it after them.
        self.process = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            start_new_session=True,
            # preexec_fn is safe here: the supervisor runs no threads.
            preexec_fn=_pdeathsig_hook(os.getpid()),
        )
        deadline = time.monotonic() + READY_TIMEOUT_S
        while not answers_ping(self.socket_path):
            if self.process.poll() is not None or time.monotonic() > deadline:
                code = self.process.poll()
                self.stop()
                raise PrivateRedisError(
                    f"redis-server ({self.binary}) did not start"
                    + (f": exit code {code}" if code is not None else "")
                )
            time.sleep(0.01)

    def exited(self) -> int | None:
        """Its exit code if it has died, else ``None``."""
        return None if self.process is None else self.process.poll()

    def stop(self) -> None:
        """SIGTERM, wait up to ``STOP_TIMEOUT_S``, then SIGKILL; nothing if not running."""
        process, self.process = self.process, None
        if process is None or process.poll() is not None:
            return
        process.terminate()
        try:
            process.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
