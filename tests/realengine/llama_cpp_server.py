"""llama.cpp's own HTTP server (``llama-server``) as a real subprocess on loopback.

A continuous-batching engine: ``--parallel N`` slots decoded together, its own
wait queue (``llamacpp:requests_deferred``), ``/health``, ``/slots`` and
Prometheus ``/metrics``. The binary is built from the pinned llama-cpp-python
sdist by ``make llama-server`` (``scripts/build-llama-server.sh``) and found
through ``SLUICEGATE_LLAMA_SERVER`` or the per-version cache directory; a
missing binary fails the test, saying how to build it (never a skip).

The server loads one GGUF under the alias ``tiny`` (the harness's model
name); it is ready once ``GET /health`` answers 200 (503 while loading).
"""

from __future__ import annotations

import os
import re
import subprocess
import threading
import time
import urllib.request
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import pytest

from sluicegate.config import parse_config
from sluicegate.gateway.app import build_app
from tests.gateway.gateway_harness import ADMIN_KEY, MODEL, Stack, serve_in_thread, unused_port
from tests.realengine.engine_process import answers_200, start_engine, stop_engine

LLAMA_SERVER_VERSION = "0.3.36"  # the llama-cpp-python sdist it is built from (Makefile's pin)
BUILD_HINT = (
    "build it with `make llama-server` (scripts/build-llama-server.sh {version} {dir}), "
    "or point SLUICEGATE_LLAMA_SERVER at a llama-server binary"
)


def llama_server_binary() -> Path:
    """The llama-server binary: ``$SLUICEGATE_LLAMA_SERVER``, else
    ``$XDG_CACHE_HOME/sluicegate/llama-server-<version>/llama-server`` (``~/.cache`` by
    default). Fails the calling test, saying how to build it, when it is missing."""
    configured = os.environ.get("SLUICEGATE_LLAMA_SERVER")
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    directory = cache / "sluicegate" / f"llama-server-{LLAMA_SERVER_VERSION}"
    binary = Path(configured) if configured else directory / "llama-server"
    if not (binary.is_file() and os.access(binary, os.X_OK)):
        hint = BUILD_HINT.format(version=LLAMA_SERVER_VERSION, dir=directory)
        pytest.fail(f"no llama-server binary at {binary}: {hint}", pytrace=False)
    return binary


def parse_prometheus(text: str) -> dict[str, float]:
    """Every sample of a Prometheus text body by metric name, summed over labels."""
    values: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        head, _, value = line.rpartition(" ")
        name = head.split("{", 1)[0].strip()
        values[name] = values.get(name, 0.0) + float(value)
    return values


@dataclass(frozen=True)
class TaskEnd:
    """How llama-server ended a task: ``cancelled`` (its client left) or not, and the
    slot's ``n_tokens`` (prompt plus generated) when it was released."""

    cancelled: bool
    n_tokens: int


@dataclass
class LlamaCppServer:
    """One ``llama-server`` process serving ``model`` with ``parallel`` slots and
    ``ctx`` tokens of context in all (``-c`` is split over the slots).

    Every start uses the same port, so a gateway configured with its URL finds
    it again after a restart.
    """

    model: Path
    log: Path
    parallel: int = 4
    ctx: int = 8192
    extra: Sequence[str] = ()
    port: int = 0
    _process: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    @property
    def url(self) -> str:
        """The server's base URL on loopback."""
        return f"http://127.0.0.1:{self.port}"

    def command(self) -> list[str]:
        """The command line: metrics and /slots on, no web UI, and one thread unless
        ``extra`` sets ``--threads``: the gateway and the clients share the machine's
        cores, and llama.cpp's default (every core) stalls a whole step whenever another
        process takes one (decode steps of ~330 ms instead of 1-3 ms were seen)."""
        threads = [] if {"-t", "--threads"} & set(self.extra) else ["--threads", "1"]
        # Every open stream, and every request waiting for a slot, holds one of its HTTP
        # threads (by default --parallel + 2): with more in flight, /metrics, /slots and
        # /health wait for a thread, and a test reading them times out.
        if "--threads-http" not in self.extra:
            threads += ["--threads-http", "64"]
        return [
            str(llama_server_binary()), "-m", str(self.model), "--alias", MODEL,
            "--host", "127.0.0.1", "--port", str(self.port),
            "--parallel", str(self.parallel), "-c", str(self.ctx),
            "--metrics", "--slots", "--no-webui", *threads, *self.extra,
        ]  # fmt: skip

    def start(self) -> None:
        """Start the server and wait until ``/health`` answers 200; RuntimeError with the
        log's tail if it dies or is not ready in time."""
        assert self._process is None, "already running"
        self.port = self.port or unused_port()
        command = self.command()  # fails the test if the binary is missing
        self._process = start_engine(command, self.log, self.healthy, "llama-server")

    def stop(self) -> None:
        """Terminate the process (SIGTERM, then SIGKILL after 10 s) and reap it."""
        process, self._process = self._process, None
        stop_engine(process)

    @property
    def pid(self) -> int:
        """The running server's process id."""
        assert self._process is not None, "not running"
        return self._process.pid

    def healthy(self) -> bool:
        """Whether ``GET /health`` answers 200 (the model is loaded)."""
        return answers_200(self.url + "/health")

    def get(self, path: str, timeout: float = 5.0) -> bytes:
        """The body of ``GET path``; raises on anything but 200."""
        with urllib.request.urlopen(self.url + path, timeout=timeout) as response:
            body: bytes = response.read()
            return body

    def get_json(self, path: str) -> Any:
        """``GET path`` decoded as JSON."""
        return orjson.loads(self.get(path))

    def slots(self) -> list[dict[str, Any]]:
        """``GET /slots``: one object per slot (``id``, ``is_processing``, ...)."""
        slots: list[dict[str, Any]] = self.get_json("/slots")
        return slots

    def busy_slots(self) -> int:
        """How many slots are processing a request now."""
        return sum(bool(slot.get("is_processing")) for slot in self.slots())

    def metrics(self) -> dict[str, float]:
        """``GET /metrics`` by metric name (``llamacpp:requests_deferred``, ...)."""
        return parse_prometheus(self.get("/metrics").decode())

    def task_end(self, task: int) -> TaskEnd | None:
        """How task ``task`` ended, from the server's log: None until its slot released it."""
        log = self.log.read_text(errors="replace")
        released = re.search(rf"\| task {task} \| stop processing: n_tokens = (\d+)", log)
        if released is None:
            return None
        cancelled = f"cancel task, id_task = {task}\n" in log
        return TaskEnd(cancelled=cancelled, n_tokens=int(released.group(1)))

    def wait_idle(self, within_s: float) -> bool:
        """Whether every slot is idle within ``within_s`` seconds."""
        deadline = time.monotonic() + within_s
        while True:
            try:
                if self.busy_slots() == 0:
                    return True
            except OSError:
                pass
            if time.monotonic() > deadline:
                return False
            time.sleep(0.02)


@contextmanager
def llama_cpp_server(
    model: Path,
    *,
    parallel: int = 4,
    ctx: int = 8192,
    log: Path,
    extra: Sequence[str] = (),
) -> Iterator[LlamaCppServer]:
    """A started :class:`LlamaCppServer`, stopped on exit whatever state it was left in."""
    server = LlamaCppServer(model, log, parallel=parallel, ctx=ctx, extra=tuple(extra))
    server.start()
    try:
        yield server
    finally:
        server.stop()


def llama_server_config(
    engine_ports: Sequence[int], body: str = "", *, max_concurrency: int | None = 4
) -> str:
    """Gateway YAML for model ``tiny`` with one ``engine: llama-server`` backend per port
    (named ``llama-0``, ``llama-1``, ...), each capped at ``max_concurrency`` (its
    ``--parallel``; None: uncapped).

    ``body`` is appended under the model (model keys indented by four spaces) and may
    end with top-level keys such as ``server:``.
    """
    cap = "" if max_concurrency is None else f", max_concurrency: {max_concurrency}"
    backends = "".join(
        f"      - {{name: llama-{i}, url: 'http://127.0.0.1:{port}', engine: llama-server{cap}}}\n"
        for i, port in enumerate(engine_ports)
    )
    return f"models:\n  - name: {MODEL}\n    backends:\n{backends}{body}"


@contextmanager
def llama_server_gateway(
    engine_ports: Sequence[int],
    body: str = "",
    *,
    max_concurrency: int | None = 4,
    scrape: bool = True,
) -> Iterator[Stack]:
    """A gateway in a thread in front of the llama-servers at ``engine_ports``."""
    config = parse_config(llama_server_config(engine_ports, body, max_concurrency=max_concurrency))
    app = build_app(config, environ={"SLUICEGATE_ADMIN_KEY": ADMIN_KEY}, scrape=scrape)
    with serve_in_thread(app) as port:
        yield Stack(port, tuple(engine_ports), config)


class MetricsWatch:
    """Polls a llama-server's ``/metrics`` in a thread and keeps each metric's peak.

    Use as a context manager around the load being watched: ``peak`` holds the
    highest value seen per name and ``polls`` how many scrapes answered.
    """

    def __init__(self, server: LlamaCppServer, every_s: float = 0.01) -> None:
        self._server = server
        self._every_s = every_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="metrics-watch", daemon=True)
        self.peak: dict[str, float] = {}
        self.polls = 0

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                values = self._server.metrics()
            except OSError:
                values = {}
            if values:
                self.polls += 1
            for name, value in values.items():
                self.peak[name] = max(value, self.peak.get(name, value))
            self._stop.wait(self._every_s)

    def __enter__(self) -> MetricsWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
