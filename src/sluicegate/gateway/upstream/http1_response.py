"""An engine's answer as the HTTP/1.1 client (``http1.py``) hands it over: status and
headers at once, the body as it arrives, with flow control and the body cap; and the
client's errors.

Two ways to read a body: ``readany`` wakes the reader for each read of the
connection; ``consume`` hands each piece to a callback on the connection's side and
wakes the reader once, at the end (a long stream rebuilt into one answer costs no
task switch per event).

Flow control: when more than ``READ_BUFFER_BYTES`` of an answer are buffered unread
(a client slower than its engine), the connection stops reading until they are taken.
"""

from __future__ import annotations

import asyncio
import sys
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING

from sluicegate.errors import SluicegateError

if TYPE_CHECKING:
    from sluicegate.gateway.upstream.http1 import _Connection

READ_BUFFER_BYTES = 1024 * 1024


class UpstreamError(SluicegateError):
    """The engine's connection failed: refused, dropped, or sent what is not HTTP."""


class StaleConnectionError(UpstreamError):
    """A pooled connection closed before any byte of the answer: safe to send again."""


class UpstreamProtocolError(UpstreamError):
    """The engine's answer went over a cap or broke HTTP; ``code`` names which (the 502's
    error code: ``upstream_head_too_large``, ``upstream_body_too_large``,
    ``upstream_protocol_error``). Its connection is closed."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


class Http1Response:
    """An engine's answer: status and headers at once, the body as it arrives."""

    def __init__(self, connection: _Connection, request_id: str = "") -> None:
        self.status = 0
        self.headers: dict[str, str] = {}
        self.keep_alive = False
        self.request_id = request_id
        self.received = 0  # body bytes so far
        self._max_body = sys.maxsize  # no cap until ``limit_body``
        self._connection: _Connection | None = connection
        self._waiter: asyncio.Future[None] | None = None
        self._chunks: deque[bytes] = deque()
        self._buffered = 0
        self._paused = False
        self.any_byte = False
        self.has_head = False
        self._done = False
        self._error: UpstreamError | None = None
        self._sink: Callable[[bytes], bool] | None = None
        self._sink_stopped = False
        self._sink_error: Exception | None = None

    @property
    def content_type(self) -> str:
        """The media type of ``Content-Type`` without parameters, lower case."""
        return self.headers.get("content-type", "").split(";", 1)[0].strip().lower()

    async def read(self) -> bytes:
        """The whole (rest of the) body."""
        parts = []
        while chunk := await self.readany():
            parts.append(chunk)
        return b"".join(parts)

    async def readany(self) -> bytes:
        """What has arrived of the body since the last call, waiting if nothing has;
        ``b""`` at its end."""
        while not self._chunks:
            if self._done:
                return b""
            await self._news()
        return self._take()

    async def consume(self, sink: Callable[[bytes], bool]) -> None:
        """Hand the (rest of the) body to ``sink``, each piece as it arrives, called from
        the connection's side: this reader sleeps until the body ends (returns), fails
        (raises ``UpstreamError``), or ``sink`` returns ``True`` (returns; the rest is left
        unread). A ``sink`` must be quick; an exception it raises is raised here."""
        if self._chunks and sink(self._take()):
            return
        self._sink = sink
        try:
            while not (self._done or self._sink_stopped):
                await self._news()
            if self._sink_error is not None:
                raise self._sink_error
        finally:
            self._sink = None
            self._sink_stopped = False

    def _take(self) -> bytes:
        """Everything buffered, as one piece; reading resumes if it was paused."""
        chunks = self._chunks
        data = chunks.popleft() if len(chunks) == 1 else b"".join(chunks)
        chunks.clear()
        self._buffered = 0
        if self._paused:
            self._paused = False
            if self._connection is not None:
                self._connection.pause(False)
        return data

    def limit_body(self, max_bytes: int) -> None:
        """Cap the body at ``max_bytes`` (for a reader that keeps all of it): over it,
        declared or as it arrives, the answer fails with ``upstream_body_too_large`` and
        its connection closes."""
        self._max_body = max_bytes
        declared = self.headers.get("content-length", "")
        if self.received > max_bytes or (declared.isdigit() and int(declared) > max_bytes):
            self._body_too_large()

    def _body_too_large(self) -> None:
        connection = self._connection
        self.fail(self._over_body_cap(), discard=True)
        if connection is not None:
            connection.close()

    def _over_body_cap(self) -> UpstreamProtocolError:
        return UpstreamProtocolError(
            "upstream_body_too_large",
            f"the engine's answer is over the {self._max_body}-byte body cap",
        )

    def release(self) -> None:
        """Done with the answer: its connection goes back to the pool if it can be reused."""
        connection, self._connection = self._connection, None
        if connection is None:
            return
        connection.detach()
        if self._done and self.keep_alive and not connection.closed and not connection.one_shot:
            if self._paused:
                connection.pause(False)
            connection.reused = True
            connection.pool.give_back(connection)
        else:
            connection.close()

    def close(self) -> None:
        """Done with the answer, read or not: close its connection (a reader still waiting
        gets ``UpstreamError``)."""
        self.fail(UpstreamError("the answer was closed"))
        connection, self._connection = self._connection, None
        if connection is not None:
            connection.detach()
            connection.close()

    # ------------------------------------------------------------------ the connection's side

    async def wait_head(self) -> None:
        """Wait for status and headers."""
        while not self.has_head:
            await self._news()

    def headers_complete(self, status: int) -> None:
        """The head has been parsed."""
        self.status = status
        self.has_head = True
        self.any_byte = True
        self._wake()

    def body_received(self, body: bytes) -> None:
        """Hand a piece of the body to the ``consume`` sink, or buffer it, pausing the
        connection above the limit; over the body cap, raise (inside the parser, which
        stops)."""
        self.received += len(body)
        if self.received > self._max_body:
            raise self._over_body_cap()
        sink = self._sink
        if sink is not None:
            self._to_sink(sink, body)
            return
        self._chunks.append(body)
        self._buffered += len(body)
        if self._buffered > READ_BUFFER_BYTES and not self._paused:
            self._paused = True
            if self._connection is not None:
                self._connection.pause(True)
        self._wake()

    def _to_sink(self, sink: Callable[[bytes], bool], body: bytes) -> None:
        try:
            stop = sink(body)
        except Exception as exc:  # raised in the reader, not inside the parser
            self._sink_error = exc
            stop = True
        if stop:
            self._sink = None
            self._sink_stopped = True
            self._wake()

    def complete(self) -> None:
        """The body is complete."""
        self._done = True
        self._wake()

    def fail(self, error: UpstreamError, *, discard: bool = False) -> None:
        """The answer cannot be completed; ``discard``: drop what is buffered unread (the
        reader gets the error at once)."""
        if self._done or self._error is not None:
            return
        self._error = error
        if discard:
            self._chunks.clear()
            self._buffered = 0
        self._wake()

    def connection_lost(self, exc: Exception | None) -> None:
        """The connection closed: the end of a body read to EOF if the engine closed it
        cleanly, else a failure (a failed answer stays failed)."""
        if self._done or self._error is not None:
            return
        if exc is None and self.has_head and self._reads_to_eof():
            self.complete()
        elif not self.any_byte:
            self.fail(StaleConnectionError("the engine closed the connection"))
        else:
            self.fail(UpstreamError("the engine's answer was cut off"))

    def _reads_to_eof(self) -> bool:
        headers = self.headers
        return (
            "content-length" not in headers
            and "chunked" not in headers.get("transfer-encoding", "").lower()
        )

    async def _news(self) -> None:
        """Wait until the connection's side next calls in (a head, body, its end, a
        failure), or raise the failure there already is. One reader waits at a time:
        ``wait_head`` before the answer is handed over, then its body's reader."""
        if self._error is not None:
            raise self._error
        self._waiter = asyncio.get_running_loop().create_future()
        try:
            await self._waiter
        finally:
            self._waiter = None

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)
