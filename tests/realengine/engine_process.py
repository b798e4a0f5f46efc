"""Start and stop a real engine's process for the real-engine tests: both llama.cpp servers
(llama-cpp-python's and llama-server) are started and reaped the same way."""

from __future__ import annotations

import subprocess
import time
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 10.0


def answers_200(url: str, timeout_s: float = 2.0) -> bool:
    """Whether ``GET url`` answers 200 within ``timeout_s`` (False when refused, reset or
    timed out)."""
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response:
            return bool(response.status == 200)
    except OSError:  # URLError and TimeoutError included
        return False


def start_engine(
    command: Sequence[str],
    log: Path,
    ready: Callable[[], bool],
    name: str,
    env: Mapping[str, str] | None = None,
) -> subprocess.Popen[bytes]:
    """Start ``command`` with its output appended to ``log`` and wait until ``ready()``;
    ``RuntimeError`` with the log's tail if it exits or is not ready within
    ``START_TIMEOUT_S`` (the process is stopped first)."""
    begun = time.monotonic()
    with log.open("ab") as out:
        process = subprocess.Popen(
            list(command), stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            env=None if env is None else dict(env),
        )  # fmt: skip
    while not ready():
        if process.poll() is not None or time.monotonic() - begun > START_TIMEOUT_S:
            stop_engine(process)
            tail = log.read_text(errors="replace")[-3000:]
            raise RuntimeError(f"{name} did not start:\n{tail}")
        time.sleep(0.05)
    return process


def stop_engine(process: subprocess.Popen[bytes] | None) -> None:
    """Terminate ``process`` (SIGTERM, then SIGKILL after ``STOP_TIMEOUT_S``) and reap it."""
    if process is None:
        return
    process.terminate()
    try:
        process.wait(timeout=STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout=STOP_TIMEOUT_S)
