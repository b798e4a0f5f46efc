"""Helpers for the hardening tests: an engine that records what reaches it, raw HTTP exchanges,
and a capture of every log record the servers emit.

The engine is the real emulator behind a thin ASGI recorder, served by uvicorn on
loopback, so "nothing was forwarded" is checked against what an engine received.
"""

from __future__ import annotations

import logging
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from starlette.types import Message, Receive, Scope, Send

from sluicegate.emulator import build_app as build_emulator
from sluicegate.engine import EngineConfig, preset

MODEL = "tiny"


@dataclass
class Seen:
    """One HTTP request as an engine received it."""

    method: str
    path: str
    headers: dict[str, str]
    body: bytearray = field(default_factory=bytearray)


class RecordingEngine:
    """The emulator (model ``tiny``), recording every HTTP request as it arrives."""

    def __init__(self, engine: EngineConfig | None = None, *, seed: int = 0) -> None:
        self._app = build_emulator(engine or preset("tiny"), model=MODEL, seed=seed)
        self.seen: list[Seen] = []

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Record the request (headers at once, body as it is read), then serve it."""
        if scope["type"] != "http":
            await self._app(scope, receive, send)
            return
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
        seen = Seen(scope["method"], scope["path"], headers)
        self.seen.append(seen)

        async def recording_receive() -> Message:
            message = await receive()
            if message["type"] == "http.request":
                seen.body.extend(message.get("body", b""))
            return message

        await self._app(scope, recording_receive, send)

    def inference(self) -> list[Seen]:
        """The inference requests received (POSTs under ``/v1/``), oldest first."""
        return [s for s in self.seen if s.method == "POST" and s.path.startswith("/v1/")]


@dataclass(frozen=True)
class RawReply:
    """An HTTP answer read off a raw socket."""

    status: int
    headers: dict[str, str]
    body: bytes
    seconds: float

    @property
    def closes(self) -> bool:
        """Whether the server said it will close the connection."""
        return self.headers.get("connection", "").lower() == "close"


class HangError(AssertionError):
    """The server did not answer in time: a hang is a failure."""


def _read_reply(sock: socket.socket, started: float) -> RawReply:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = _recv(sock)
        if not chunk:
            raise AssertionError(f"connection closed before a full response head: {data!r}")
        data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ")[1])
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    length = int(headers.get("content-length", "0"))
    while len(rest) < length:
        chunk = _recv(sock)
        if not chunk:
            break
        rest += chunk
    return RawReply(status, headers, rest[:length], time.monotonic() - started)


def _recv(sock: socket.socket) -> bytes:
    try:
        return sock.recv(65536)
    except TimeoutError as exc:
        raise HangError("no answer within the socket timeout") from exc


def raw_exchange(
    port: int, data: bytes, *, timeout: float = 5.0, half_close: bool = False
) -> RawReply:
    """Send ``data`` as is on a fresh connection and read one response (every read times out).

    ``half_close`` shuts our sending side after ``data`` (the client has nothing more to say).
    """
    started = time.monotonic()
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(data)
        if half_close:
            sock.shutdown(socket.SHUT_WR)
        return _read_reply(sock, started)


@contextmanager
def open_socket(port: int, timeout: float = 5.0) -> Iterator[socket.socket]:
    """A connected loopback socket whose every operation times out."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        yield sock


def read_reply(sock: socket.socket) -> RawReply:
    """One response from an open socket (every read times out)."""
    return _read_reply(sock, time.monotonic())


def request_bytes(
    method: str,
    target: str,
    headers: list[tuple[str, str]] | None = None,
    body: bytes = b"",
    *,
    content_length: bool = True,
) -> bytes:
    """An HTTP/1.1 request, byte for byte (Host first, then ``headers`` in order)."""
    lines = [f"{method} {target} HTTP/1.1", "Host: 127.0.0.1"]
    lines += [f"{name}: {value}" for name, value in headers or []]
    if content_length:
        lines.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


class LogCapture(logging.Handler):
    """Every record of the loggers it is attached to, formatted with its traceback."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.setFormatter(logging.Formatter("%(name)s %(levelname)s %(message)s"))
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        """Keep the formatted record, args and traceback included."""
        self.lines.append(self.format(record))

    def text(self) -> str:
        """All records so far, one per line."""
        return "\n".join(self.lines)

    def matching(self, needle: str) -> list[str]:
        """The records that contain ``needle``."""
        return [line for line in self.lines if needle in line]


SERVER_LOGGERS = ("", "uvicorn", "uvicorn.error", "uvicorn.access", "sluicegate", "aiohttp")


@contextmanager
def capture_server_logs(level: int = logging.DEBUG) -> Iterator[LogCapture]:
    """Watch every record of the root, uvicorn, sluicegate and aiohttp loggers, at ``level``.

    The capture is attached to the root logger and to each listed logger that
    does not propagate (uvicorn's own); levels are restored on exit. Start it
    after the servers: uvicorn reconfigures its loggers when a server starts.
    """
    capture = LogCapture()
    saved = []
    for name in SERVER_LOGGERS:
        logger = logging.getLogger(name)
        attach = not name or not logger.propagate
        saved.append((logger, logger.level, attach))
        if attach:
            logger.addHandler(capture)
        logger.setLevel(level)
    try:
        yield capture
    finally:
        for logger, old, attached in saved:
            if attached:
                logger.removeHandler(capture)
            logger.setLevel(old)
