"""A real ``sluicegate serve`` in a process of its own, for what only a separate process
shows: its resident memory (``/proc/PID/status``) and its event loop's responsiveness
(``/healthz`` latency, sampled from another thread while something else runs).

Used by the hostile-engine tests and by ``benchmarks``-style measurements that run the
same gateway from another checkout (``pythonpath``).
"""

from __future__ import annotations

import http.client
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from sluicegate.demo.processes import free_port
from tests.distributed.cluster import Child, spawn, stop_children, wait_ready

MODEL = "tiny"


def gateway_yaml(
    port: int,
    engine_url: str,
    server: str = "",
    model: str = "",
    models: Sequence[tuple[str, str]] = ((MODEL, "vllm"),),
) -> str:
    """A config on ``port`` whose ``models`` (name, engine kind) each have one backend at
    ``engine_url``; ``server`` and ``model`` are extra flow-mapping keys (``"a: 1, b: 2"``)
    of ``server`` and of every model."""
    server_keys = f"port: {port}, admin_key_env: null" + (f", {server}" if server else "")
    model_keys = f", {model}" if model else ""
    return f"server: {{{server_keys}}}\nmodels:\n" + "".join(
        f"  - {{name: {name}, max_inflight_tokens: off{model_keys},"
        f" backends: [{{name: e0, url: '{engine_url}', engine: {kind}}}]}}\n"
        for name, kind in models
    )


@dataclass
class GatewayProcess:
    """A running gateway process: its URL and its memory."""

    child: Child

    @property
    def url(self) -> str:
        """Base URL on loopback."""
        return self.child.url

    def _status(self, key: str) -> int:
        for line in Path(f"/proc/{self.child.proc.pid}/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
        raise KeyError(key)

    def rss(self) -> int:
        """Resident memory now, in bytes."""
        return self._status("VmRSS")

    def peak_rss(self) -> int:
        """The most resident memory since the last ``reset_peak`` (or the start), in bytes."""
        return self._status("VmHWM")

    def reset_peak(self) -> None:
        """Start the peak (``VmHWM``) over from the current resident memory."""
        Path(f"/proc/{self.child.proc.pid}/clear_refs").write_text("5")

    def alive(self) -> bool:
        """Whether the process still runs."""
        return self.child.proc.poll() is None

    def log(self) -> str:
        """The end of its output."""
        return self.child.log_tail(4000)

    def log_size(self) -> int:
        """How many bytes of output it has written so far."""
        return self.child.log.stat().st_size

    def log_since(self, offset: int) -> str:
        """Its output after the first ``offset`` bytes."""
        with self.child.log.open("rb") as log:
            log.seek(offset)
            return log.read().decode(errors="replace")


@contextmanager
def gateway_process(
    engine_url: str,
    log_dir: Path,
    *,
    server: str = "",
    model: str = "",
    models: Sequence[tuple[str, str]] = ((MODEL, "vllm"),),
    pythonpath: str = "",
) -> Iterator[GatewayProcess]:
    """``sluicegate serve`` in front of ``engine_url`` (see ``gateway_yaml``), ready to
    serve; ``pythonpath`` runs another checkout's source. Stopped on exit."""
    port = free_port()
    path = log_dir / "gateway.yaml"
    path.write_text(gateway_yaml(port, engine_url, server, model, models))
    env = {"PYTHONPATH": pythonpath} if pythonpath else {}
    child = spawn("gateway", ["serve", "--config", str(path)], port, log_dir, env)
    try:
        wait_ready([(child, "/healthz")])
        yield GatewayProcess(child)
    finally:
        stop_children([child])


@dataclass
class HealthzProbe:
    """Asks ``/healthz`` every ``every_s`` on one keep-alive connection, from a thread,
    recording each answer's latency, until stopped."""

    url: str
    every_s: float = 0.005
    latencies: list[float] = field(default_factory=list)
    failures: int = 0
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> None:
        """Start asking."""
        self._thread = threading.Thread(target=self._run, name="healthz-probe", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop asking and wait for the thread."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)

    def p99(self) -> float:
        """The 99th percentile latency in seconds (the worst of fewer than 100)."""
        ordered = sorted(self.latencies)
        assert ordered, "no /healthz answer was recorded"
        return ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]

    def _run(self) -> None:
        host, _, port = self.url.removeprefix("http://").partition(":")
        connection = http.client.HTTPConnection(host, int(port), timeout=10)
        try:
            while not self._stop.is_set():
                started = time.perf_counter()
                try:
                    connection.request("GET", "/healthz")
                    response = connection.getresponse()
                    response.read()
                    ok = response.status == 200
                except (OSError, http.client.HTTPException):
                    ok = False
                    connection.close()
                    connection = http.client.HTTPConnection(host, int(port), timeout=10)
                # A failed ask counts with the time it took: a stalled loop is what shows.
                self.latencies.append(time.perf_counter() - started)
                self.failures += not ok
                self._stop.wait(self.every_s)
        finally:
            connection.close()


@contextmanager
def probing(url: str) -> Iterator[HealthzProbe]:
    """A running ``HealthzProbe`` of ``url``, stopped on exit."""
    probe = HealthzProbe(url)
    probe.start()
    try:
        yield probe
    finally:
        probe.stop()
