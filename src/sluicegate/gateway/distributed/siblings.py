"""One gateway over several worker processes (``serve --workers N``): the fan-out.

With ``SO_REUSEPORT`` the kernel hands each connection on the shared port to any
worker, so the endpoints that describe the whole gateway ask the other workers.
Every worker also serves its app on a private unix socket in the run directory
(``<run_dir>/w<i>.sock``); the worker that answers ``/metrics``,
``/admin/state``, ``/admin/drain`` or ``/admin/undrain`` on the shared port sends
the same request with ``?worker=local`` to its siblings over those sockets (a
request with ``?worker=local`` is answered by the worker alone and never fans
out) and merges the answers. The single-process gateway has no ``WorkerTopology`` and never
comes here.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import orjson

WORKER_ENV = "SLUICEGATE_WORKER"
"""The environment variable the supervisor hands each worker its settings in (JSON)."""

LOCAL_QUERY = "worker=local"
"""The query string of a request one worker answers alone."""

DRAIN_MARK = "draining"
"""A file in the run directory: the gateway was drained, and a restarted worker drains too
(``/admin/undrain`` removes it)."""

SIBLING_TIMEOUT_S = 2.0
"""How long a fan-out waits for one sibling before counting it as not answering."""


@dataclass(frozen=True, slots=True)
class WorkerTopology:
    """Where this worker sits among its siblings.

    Attributes:
        index: this worker's number, 0 … count − 1.
        count: how many workers the supervisor runs.
        run_dir: the supervisor's private directory (sockets, the drain mark).
    """

    index: int
    count: int
    run_dir: Path

    def socket_path(self, index: int) -> Path:
        """The private unix socket worker ``index`` serves its app on."""
        return self.run_dir / f"w{index}.sock"

    def siblings(self) -> list[int]:
        """Every other worker's index."""
        return [i for i in range(self.count) if i != self.index]

    @property
    def drain_mark(self) -> Path:
        """The file that says the gateway is draining."""
        return self.run_dir / DRAIN_MARK


def topology_from_environ(environ: Mapping[str, str] | None = None) -> WorkerTopology | None:
    """This process's place among the workers, or ``None`` outside ``serve --workers``."""
    raw = (os.environ if environ is None else environ).get(WORKER_ENV)
    if not raw:
        return None
    data = orjson.loads(raw)
    return WorkerTopology(int(data["index"]), int(data["count"]), Path(data["run_dir"]))


@dataclass(frozen=True, slots=True)
class SiblingAnswer:
    """One sibling's answer (``status`` 0 and ``error`` set when it did not answer)."""

    index: int
    status: int
    body: bytes
    error: str | None = None


async def _exchange(path: Path, request: bytes) -> tuple[int, bytes]:
    reader, writer = await asyncio.open_unix_connection(str(path))
    try:
        writer.write(request)
        await writer.drain()
        raw = await reader.read()
    finally:
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()
    head, _, body = raw.partition(b"\r\n\r\n")
    status_line = head.split(b"\r\n", 1)[0].split()
    if len(status_line) < 2 or not status_line[1].isdigit():
        raise ValueError("no HTTP status line")
    return int(status_line[1]), _body(head, body)


def _body(head: bytes, body: bytes) -> bytes:
    """The body as sent: ``Content-Length`` bytes, or de-chunked."""
    headers = head.lower()
    if b"transfer-encoding: chunked" not in headers:
        return body
    out = bytearray()
    while body:
        size_line, _, rest = body.partition(b"\r\n")
        size = int(size_line.split(b";")[0], 16)
        if size == 0:
            break
        out += rest[:size]
        body = rest[size + 2 :]
    return bytes(out)


async def ask(
    topology: WorkerTopology,
    index: int,
    method: str,
    path: str,
    authorization: str | None,
) -> SiblingAnswer:
    """Send ``method path?worker=local`` to worker ``index`` over its private socket."""
    lines = [f"{method} {path}?{LOCAL_QUERY} HTTP/1.1", "Host: sluicegate-worker"]
    if authorization is not None:
        lines.append(f"Authorization: {authorization}")
    lines += ["Content-Length: 0", "Connection: close", "", ""]
    request = "\r\n".join(lines).encode("latin-1")
    try:
        status, body = await asyncio.wait_for(
            _exchange(topology.socket_path(index), request), SIBLING_TIMEOUT_S
        )
    except (OSError, ValueError, TimeoutError) as exc:
        return SiblingAnswer(index, 0, b"", f"{type(exc).__name__}: {exc}".rstrip(": "))
    return SiblingAnswer(index, status, body)


async def ask_siblings(
    topology: WorkerTopology, method: str, path: str, authorization: str | None
) -> list[SiblingAnswer]:
    """Ask every sibling at once; answers in worker order."""
    return list(
        await asyncio.gather(
            *(ask(topology, i, method, path, authorization) for i in topology.siblings())
        )
    )


def _labelled(line: str, label: str) -> str:
    """A sample line with ``label`` (``worker="i"``) as its first label."""
    brace = line.find("{")
    space = line.find(" ")
    if brace != -1 and (space == -1 or brace < space):
        closing = line.find("}", brace)
        inner = line[brace + 1 : closing].strip() if closing != -1 else ""
        joiner = "," if inner else ""
        return f"{line[: brace + 1]}{label}{joiner}{line[brace + 1 :]}"
    if space == -1:
        return line
    return f"{line[:space]}{{{label}}}{line[space:]}"


def _family_name(line: str) -> str:
    parts = line.split(" ", 3)
    return parts[2] if len(parts) > 2 else ""


def merge_metrics(texts: Sequence[tuple[int, str]]) -> str:
    """Prometheus text of several workers as one exposition.

    Each family keeps one ``# HELP`` and ``# TYPE`` (from the first worker that has
    it) and gets every worker's samples, each with a ``worker="<i>"`` label in
    front of its own. ``texts`` are ``(worker index, text)`` pairs.
    """
    order: list[str] = []
    owner: dict[str, int] = {}  # the worker whose HELP and TYPE lines a family keeps
    headers: dict[str, list[str]] = {}
    samples: dict[str, list[str]] = {}
    for index, text in texts:
        label = f'worker="{index}"'
        family = ""
        for line in text.splitlines():
            if line.startswith(("# HELP ", "# TYPE ")):
                family = _family_name(line)
                if family not in owner:
                    owner[family] = index
                    order.append(family)
                    headers[family] = []
                    samples[family] = []
                if owner[family] == index:
                    headers[family].append(line)
            elif line and not line.startswith("#"):
                if family not in samples:
                    order.append(family)
                    headers[family] = []
                    samples[family] = []
                samples[family].append(_labelled(line, label))
    out: list[str] = []
    for family in order:
        out += headers[family]
        out += samples[family]
    return "\n".join(out) + "\n"


def worker_up_family(up: Mapping[int, bool]) -> str:
    """``sluicegate_worker_up{worker="i"}``: 1 when worker ``i`` answered this scrape."""
    lines = [
        "# HELP sluicegate_worker_up Whether the worker answered this scrape (serve --workers).",
        "# TYPE sluicegate_worker_up gauge",
    ]
    lines += [f'sluicegate_worker_up{{worker="{i}"}} {int(ok)}.0' for i, ok in sorted(up.items())]
    return "\n".join(lines) + "\n"
