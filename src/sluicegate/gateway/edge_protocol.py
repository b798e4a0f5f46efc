"""uvicorn's httptools protocol with the limits an edge server needs.

uvicorn bounds idle keep-alive connections but not a client that sends its
headers or body slowly (slowloris), nor the size or number of headers, nor
how much a client that stops reading can leave buffered. This protocol adds:

- a header timeout from the first byte of a request to the end of its headers
  (408, closed);
- a body timeout from the end of the headers to the end of the body (408, closed);
- caps on header bytes and header count (431, closed);
- a write-buffer cap per connection, so a client that stops reading pauses
  the response (and the relay in front of it) instead of growing memory;
- ``scope["extensions"]["sluicegate.abort"]``: drops the connection at once,
  for a stream whose client stopped reading (``close`` would wait to flush);
- ``scope["extensions"]["sluicegate.on_disconnect"]``: registers a callback for the
  connection's loss (called at once if it is already lost; ``None`` unregisters),
  so a request learns its client left without a task waiting on ``receive``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from sluicegate.gateway.http_errors import error_body
from sluicegate.gateway.timer import LazyTimer

ABORT_EXTENSION = "sluicegate.abort"
DISCONNECT_EXTENSION = "sluicegate.on_disconnect"


@dataclass(frozen=True, slots=True)
class ConnectionLimits:
    """Per-connection limits (``server`` section of the config)."""

    header_timeout_s: float = 10.0
    body_timeout_s: float = 30.0
    max_header_bytes: int = 32 * 1024
    max_headers: int = 100
    write_buffer_bytes: int = 256 * 1024


def _reply(status: int, reason: bytes, code: str, message: str) -> bytes:
    body = error_body(status, code, message)
    return b"".join(
        (
            b"HTTP/1.1 %d %s\r\n" % (status, reason),
            b"content-type: application/json\r\n",
            b"content-length: %d\r\n" % len(body),
            b"connection: close\r\n\r\n",
            body,
        )
    )


_HEADER_TIMEOUT = _reply(408, b"Request Timeout", "header_timeout", "request headers too slow")
_BODY_TIMEOUT = _reply(408, b"Request Timeout", "body_timeout", "request body too slow")
_HEADERS_TOO_LARGE = _reply(
    431, b"Request Header Fields Too Large", "headers_too_large", "request headers too large"
)


def guarded_protocol(limits: ConnectionLimits) -> type[HttpToolsProtocol]:
    """A protocol class for ``uvicorn.Config(http=...)`` enforcing ``limits``."""

    class GuardedHttpToolsProtocol(HttpToolsProtocol):
        """``HttpToolsProtocol`` plus the limits above."""

        # One lazy timer per connection for the header and body deadlines; ``_reply`` is
        # what a breach is answered with (None: nothing is being timed).
        _guard: LazyTimer
        _reply: bytes | None = None
        _header_bytes = 0
        _header_count = 0
        _on_lost: Callable[[], None] | None = None
        _lost = False

        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            self._guard = LazyTimer(self.loop, self._check)
            super().connection_made(transport)  # type: ignore[arg-type]
            self.transport.set_write_buffer_limits(high=limits.write_buffer_bytes)
            self._arm(limits.header_timeout_s, _HEADER_TIMEOUT)

        def connection_lost(self, exc: Exception | None) -> None:
            self._reply = None
            self._guard.cancel()
            self._lost = True
            super().connection_lost(exc)
            callback, self._on_lost = self._on_lost, None
            if callback is not None:
                callback()

        def on_message_begin(self) -> None:
            super().on_message_begin()
            self._header_bytes = 0
            self._header_count = 0
            extensions: dict[str, Any] = {
                ABORT_EXTENSION: self._abort,
                DISCONNECT_EXTENSION: self._on_disconnect,
            }
            self.scope["extensions"] = extensions
            self._arm(limits.header_timeout_s, _HEADER_TIMEOUT)

        def on_url(self, url: bytes) -> None:
            self._header_bytes += len(url)
            if self._header_bytes > limits.max_header_bytes:
                self._refuse(_HEADERS_TOO_LARGE)
                return
            super().on_url(url)

        def on_header(self, name: bytes, value: bytes) -> None:
            self._header_bytes += len(name) + len(value) + 4
            self._header_count += 1
            if self._header_bytes > limits.max_header_bytes or (
                self._header_count > limits.max_headers
            ):
                self._refuse(_HEADERS_TOO_LARGE)
                return
            super().on_header(name, value)

        def on_headers_complete(self) -> None:
            if self.transport.is_closing():
                return
            self._arm(limits.body_timeout_s, _BODY_TIMEOUT)
            super().on_headers_complete()

        def on_body(self, body: bytes) -> None:
            if not self.transport.is_closing():
                super().on_body(body)

        def on_message_complete(self) -> None:
            if self.transport.is_closing():
                return
            self._disarm()
            super().on_message_complete()

        def data_received(self, data: bytes) -> None:
            if self.transport.is_closing():
                return
            super().data_received(data)

        def _arm(self, seconds: float, reply: bytes) -> None:
            self._reply = reply
            self._guard.after(seconds)

        def _disarm(self) -> None:
            self._reply = None
            self._guard.clear()

        def _check(self) -> None:
            reply = self._reply
            if reply is not None:
                self._reply = None
                self._expire(reply)

        def _expire(self, reply: bytes) -> None:
            cycle = self.cycle
            if cycle is not None and cycle.response_started:
                self._abort()
                return
            self._refuse(reply)

        def _refuse(self, reply: bytes) -> None:
            if self.transport.is_closing():
                return
            self._disarm()
            self.transport.write(reply)
            self.transport.close()

        def _on_disconnect(self, callback: Callable[[], None] | None) -> None:
            if callback is not None and self._lost:
                callback()
                return
            self._on_lost = callback

        def _abort(self) -> None:
            self._disarm()
            self.transport.abort()

    return GuardedHttpToolsProtocol


def uvicorn_protocol_kwargs(limits: ConnectionLimits) -> dict[str, Any]:
    """Keyword arguments for ``uvicorn.Config`` / ``uvicorn.run`` that install the protocol."""
    return {"http": guarded_protocol(limits)}
