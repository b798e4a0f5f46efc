"""A real Ray Serve (``serve_app.py``, its own process and Ray cluster) in front of an
emulator, shared by the module's tests: Ray takes ~15 s to start."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import pytest

from sluicegate.engine import preset
from tests.emulator.emulator_harness import run_emulator
from tests.gateway.gateway_harness import unused_port

APP = Path(__file__).with_name("serve_app.py")
REPLICAS = 2
MAX_ONGOING = 2


@dataclass(frozen=True)
class RayServe:
    """Serve's proxy and Ray's metrics agent, on loopback, and the engine behind them."""

    http_port: int
    metrics_port: int
    engine_url: str
    start_s: float

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.metrics_port}/metrics"


@pytest.fixture(scope="module")
def ray_serve() -> Iterator[RayServe]:
    """Ray Serve forwarding to an emulator of the ``tiny`` preset at 10 ms a step (a load
    lasts seconds); stopped by SIGTERM to the app (it shuts Serve and its cluster down)."""
    with (
        run_emulator(replace(preset("tiny"), base_s=0.01)) as engine,
        tempfile.TemporaryDirectory(prefix="rs", dir="/tmp") as temp,
    ):
        http_port, metrics_port = unused_port(), unused_port()
        env = {**os.environ, "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0"}
        started = time.monotonic()
        process = subprocess.Popen(
            [
                sys.executable,
                str(APP),
                engine.base_url,
                str(http_port),
                str(metrics_port),
                temp,
                str(REPLICAS),
                str(MAX_ONGOING),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env=env,
            start_new_session=True,
        )
        try:
            assert process.stdout is not None
            line = process.stdout.readline()
            assert line.strip() == b"READY", line
            yield RayServe(http_port, metrics_port, engine.base_url, time.monotonic() - started)
        finally:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
            if process.stdout is not None:
                process.stdout.close()
