"""Child processes on free loopback ports: started, waited for, and always stopped."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _ready(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=1) as response:
            return bool(response.status < 500)
    except urllib.error.HTTPError as exc:
        return exc.code < 500
    except (urllib.error.URLError, OSError):
        return False


class Children:
    """The demo's child processes; ``stop`` ends them all (also on Ctrl-C or errors)."""

    def __init__(self, log_dir: Path) -> None:
        self._procs: list[subprocess.Popen[bytes]] = []
        self._log_dir = log_dir

    def start(
        self,
        name: str,
        args: Sequence[str],
        ready_url: str,
        timeout_s: float = 30,
        *,
        env: Mapping[str, str] | None = None,
    ) -> int:
        """Run ``python -m sluicegate ARGS`` (``env`` added to this process's environment),
        wait until ``ready_url`` answers; its pid."""
        argv = [sys.executable, "-m", "sluicegate", *args]
        return self.run(name, argv, ready_url, timeout_s, env=env)

    def run(
        self,
        name: str,
        argv: Sequence[str],
        ready_url: str,
        timeout_s: float = 30,
        *,
        env: Mapping[str, str] | None = None,
    ) -> int:
        """Run the command ``argv`` as ``start`` runs sluicegate; its pid."""
        log = (self._log_dir / f"{name}.log").open("wb")
        proc = subprocess.Popen(
            argv,
            env=None if env is None else {**os.environ, **env},
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.close()
        self._procs.append(proc)
        deadline = time.monotonic() + timeout_s
        while not _ready(ready_url):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{name} did not start; see {self._log_dir / (name + '.log')}")
            time.sleep(0.1)
        return proc.pid

    def stop(self) -> None:
        """SIGTERM every child, then SIGKILL what is still alive after a grace period."""
        for proc in self._procs:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + 5
        for proc in self._procs:
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        self._procs.clear()


@contextlib.contextmanager
def children(log_dir: Path) -> Iterator[Children]:
    """A ``Children`` stopped on exit, whatever happened."""
    group = Children(log_dir)
    try:
        yield group
    finally:
        group.stop()
