"""Emulated engines and a batch-lane gateway as real processes, for the kill -9 tests.

Engines are ``sluicegate emulate`` processes and the gateway is ``sluicegate serve
--config FILE`` (optionally ``--workers N``), each started as an operator would, in
its own session (``tests/distributed/cluster.py``'s ``spawn``), so that the test can
``kill -9`` the very server process and start another on the same port and the same
SQLite database. The client side is the official ``openai`` SDK.
"""

from __future__ import annotations

import contextlib
import io
import os
import signal
import sqlite3
import time
import urllib.request
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import openai
import orjson
import yaml

from sluicegate.demo.processes import free_port
from tests.distributed.cluster import (
    ADMIN_KEY,
    ADMIN_KEY_ENV,
    Child,
    spawn,
    stop_children,
    wait_ready,
)

MODEL = "m"
LANE = "best_effort"
ENDED = ("completed", "failed", "expired", "cancelled")


@dataclass(frozen=True)
class StackSpec:
    """What to start.

    Attributes:
        engines: emulated engine processes (backends of the one model).
        preset: their preset (``instant``: ~0.2 ms steps, so a line costs about its HTTP).
        max_num_seqs: each engine's batch.
        max_concurrency: the model's and its lane's cap (the runner's window by default).
        batches: the ``batches:`` section besides ``path``.
        workers: ``serve --workers``; 1 runs the gateway in the process the test starts.
    """

    engines: int = 2
    preset: str = "instant"
    max_num_seqs: int = 256
    max_concurrency: int = 64
    batches: dict[str, Any] = field(default_factory=lambda: {"lease_s": 2, "poll_interval_s": 0.2})
    workers: int = 1


def gateway_yaml(spec: StackSpec, port: int, engine_ports: Sequence[int], db: Path) -> str:
    """The gateway's configuration: one model on the engines, a deep best-effort lane, the
    batch lane on ``db``."""
    lane = {
        "name": LANE,
        "max_concurrency": spec.max_concurrency,
        "max_queue": 100_000,
        "queue_timeout_s": 600,
        "slo_ms": 600_000,
        "policy": "fifo",
        "preemptible": "never",
    }
    config = {
        "server": {"host": "127.0.0.1", "port": port, "admin_key_env": ADMIN_KEY_ENV},
        "models": [
            {
                "name": MODEL,
                "max_concurrency": spec.max_concurrency,
                "max_inflight_tokens": "off",
                "lanes": [lane],
                "backends": [
                    {"name": f"e{i}", "url": f"http://127.0.0.1:{p}", "engine": "vllm"}
                    for i, p in enumerate(engine_ports)
                ],
            }
        ],
        "batches": {"path": str(db), **spec.batches},
    }
    return yaml.safe_dump(config, sort_keys=False)


@dataclass
class BatchStack:
    """Running engines and a gateway (restartable on its port and database)."""

    spec: StackSpec
    log_dir: Path
    engines: list[Child]
    port: int
    config: Path
    db: Path
    gateway: Child | None = None
    starts: int = 0

    @property
    def url(self) -> str:
        """The gateway's base URL."""
        return f"http://127.0.0.1:{self.port}"

    def client(self) -> openai.OpenAI:
        """An official SDK client of the gateway (no retries: a test says when to retry)."""
        return openai.OpenAI(
            base_url=self.url + "/v1", api_key="batch-test", max_retries=0, timeout=60
        )

    def start_gateway(self) -> Child:
        """``sluicegate serve`` on the stack's port and database; returns once ``/readyz``
        answers 200 (and, with workers, every worker does)."""
        self.starts += 1
        args = ["serve", "--config", str(self.config)]
        if self.spec.workers > 1:
            args += ["--workers", str(self.spec.workers)]
        child = spawn(
            f"gateway-{self.starts}", args, self.port, self.log_dir, {ADMIN_KEY_ENV: ADMIN_KEY}
        )
        self.gateway = child
        wait_ready([(child, "/readyz")])
        if self.spec.workers > 1:
            wait_for(lambda: len(self.worker_pids()) == self.spec.workers, 60, "workers")
        return child

    def kill_gateway(self) -> int:
        """``kill -9`` the gateway's server process (the one ``serve`` runs in, not a
        wrapper) and reap it; its pid."""
        child = self.gateway
        assert child is not None
        pid = child.proc.pid
        os.kill(pid, signal.SIGKILL)
        child.proc.wait(timeout=10)
        self.gateway = None
        return pid

    def worker_pids(self) -> dict[int, int]:
        """Worker index → pid, as ``/admin/state`` lists the workers that answered."""
        with contextlib.suppress(OSError, ValueError, KeyError):
            state = admin_get(self.url, "/admin/state")
            return {w["worker"]: w["pid"] for w in state.get("workers", []) if "pid" in w}
        return {}

    def engine_admitted(self) -> int:
        """Requests the engines admitted in all (each run of a line counts once)."""
        return engines_admitted(self.engines)

    def db_status(self, batch_id: str) -> str | None:
        """A batch's status read straight from the database (read-only), for a test to
        check a precondition while no gateway runs."""
        conn = sqlite3.connect(f"file:{self.db}?mode=ro", uri=True)
        try:
            row = conn.execute("SELECT status FROM batches WHERE id = ?", (batch_id,)).fetchone()
        finally:
            conn.close()
        return None if row is None else str(row[0])

    def running_lines(self, owner_pid: int | None = None) -> int:
        """Lines the database holds as claimed (``running``), by any process or by the one
        with pid ``owner_pid``: read while no gateway could reclaim them, the lines that
        were in flight when a process died."""
        query = "SELECT COUNT(*) FROM lines WHERE state = 'running'"
        params: tuple[str, ...] = ()
        if owner_pid is not None:
            query += " AND owner LIKE ?"
            params = (f"%-{owner_pid}-%",)
        conn = sqlite3.connect(f"file:{self.db}?mode=ro", uri=True)
        try:
            return int(conn.execute(query, params).fetchone()[0])
        finally:
            conn.close()

    def logs(self) -> str:
        """The tail of every gateway log, for failure messages."""
        return "\n".join(
            f"--- {log.name}\n{log.read_text(errors='replace')[-1500:]}"
            for log in sorted(self.log_dir.glob("gateway-*.log"))
        )


def start_engines(
    into: list[Child], count: int, preset: str, max_num_seqs: int, log_dir: Path
) -> None:
    """Start ``count`` ``sluicegate emulate`` engines serving ``MODEL`` (seeds 0, 1, …) and
    wait until each answers ``/health``; each is appended to ``into`` as it starts, so the
    caller stops even those started before a failure."""
    for index in range(count):
        port = free_port()
        args = ["emulate", "--port", str(port), "--preset", preset, "--model", MODEL]
        args += ["--max-num-seqs", str(max_num_seqs), "--seed", str(index)]
        into.append(spawn(f"engine-{index}", args, port, log_dir, {}))
    wait_ready([(engine, "/health") for engine in into])


def engines_admitted(engines: Sequence[Child]) -> int:
    """Requests these emulated engines admitted in all (their ``/emulator/stats``)."""
    total = 0
    for engine in engines:
        with urllib.request.urlopen(engine.url + "/emulator/stats", timeout=5) as response:
            total += int(orjson.loads(response.read())["admitted_total"])
    return total


def admin_get(url: str, path: str) -> dict[str, Any]:
    """A GET with the admin key; the JSON answer."""
    request = urllib.request.Request(url + path, headers={"Authorization": f"Bearer {ADMIN_KEY}"})
    with urllib.request.urlopen(request, timeout=5) as response:
        data: dict[str, Any] = orjson.loads(response.read())
    return data


def wait_for(check: Any, timeout_s: float, what: str, every_s: float = 0.1) -> None:
    """Poll ``check()`` until true; ``AssertionError`` naming ``what`` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(every_s)


@contextlib.contextmanager
def running_stack(spec: StackSpec, log_dir: Path) -> Iterator[BatchStack]:
    """Start the engines and the gateway; on exit end every process (and any a
    supervisor left), whatever the test did."""
    engines: list[Child] = []
    stack: BatchStack | None = None
    try:
        start_engines(engines, spec.engines, spec.preset, spec.max_num_seqs, log_dir)
        port = free_port()
        db = log_dir / "b.db"
        config = log_dir / "gateway.yaml"
        config.write_text(gateway_yaml(spec, port, [e.port for e in engines], db))
        stack = BatchStack(spec, log_dir, engines, port, config, db)
        stack.start_gateway()
        yield stack
    finally:
        children = list(engines)
        if stack is not None and stack.gateway is not None:
            children.append(stack.gateway)
        stop_children(children)


def chat_lines(count: int, prefix: str = "line", max_tokens: int = 4) -> list[bytes]:
    """``count`` JSONL request lines for ``/v1/chat/completions``, custom ids
    ``{prefix}-{i}``, each asking for ``max_tokens`` tokens."""
    return [
        orjson.dumps(
            {
                "custom_id": f"{prefix}-{i}",
                "method": "POST",
                "url": "/v1/chat/completions",
                "body": {
                    "model": MODEL,
                    "messages": [{"role": "user", "content": f"say {i}"}],
                    "max_tokens": max_tokens,
                },
            }
        )
        for i in range(count)
    ]


def upload(client: openai.OpenAI, lines: Sequence[bytes], name: str = "in.jsonl") -> Any:
    """Upload ``lines`` as a batch input file; the SDK's ``FileObject``."""
    data = b"".join(line + b"\n" for line in lines)
    return client.files.create(file=(name, io.BytesIO(data)), purpose="batch")


def wait_ended(client: openai.OpenAI, batch_id: str, timeout_s: float) -> Any:
    """Poll a batch until it ended; the SDK's ``Batch``."""
    deadline = time.monotonic() + timeout_s
    while True:
        batch = client.batches.retrieve(batch_id)
        if batch.status in ENDED:
            return batch
        if time.monotonic() > deadline:
            raise AssertionError(f"batch {batch_id} still {batch.status} after {timeout_s} s")
        time.sleep(0.2)


def custom_ids(
    client: openai.OpenAI, file_id: str | None
) -> tuple[list[str], list[dict[str, Any]]]:
    """Every line of an output or error file (none when ``file_id`` is None): the
    custom_ids in order, and the parsed lines."""
    if file_id is None:
        return [], []
    text = client.files.content(file_id).read()
    parsed = [orjson.loads(line) for line in text.splitlines() if line.strip()]
    return [str(line["custom_id"]) for line in parsed], parsed


def assert_exactly_once(
    client_ids: list[str], output: list[str], errors: list[str]
) -> tuple[int, int]:
    """Every input custom_id appears exactly once across the output and error files, and
    nothing else does; (duplicates, lost) as counted, both asserted zero."""
    seen = Counter(output + errors)
    duplicates = sum(count - 1 for count in seen.values() if count > 1)
    lost = set(client_ids) - set(seen)
    unknown = set(seen) - set(client_ids)
    assert (duplicates, len(lost), len(unknown)) == (0, 0, 0), (
        f"duplicates {duplicates} (e.g. {[i for i, c in seen.items() if c > 1][:5]}), "
        f"lost {len(lost)} (e.g. {sorted(lost)[:5]}), unknown {sorted(unknown)[:5]}"
    )
    return duplicates, len(lost)
