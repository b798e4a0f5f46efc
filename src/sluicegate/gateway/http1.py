"""A lean HTTP/1.1 client for the engines: a keep-alive pool of asyncio protocols, parsed
by httptools (llhttp, the parser uvicorn already uses).

The gateway sends one kind of request to engines: a POST with a JSON body, answered with
JSON or an event stream. For that, aiohttp's client cost about a fifth of the gateway's
CPU per request (``ClientRequest``/``ClientResponse`` objects, payload registry, a
``StreamReader`` and several futures per request; docs/BENCHMARKS.md, issue 18). Here a
request is one ``writelines`` of a pre-built head and the body, and the answer is parsed
in ``data_received`` straight into the response's buffer: one future for the head, one
per wait for more body.

Flow control: when more than ``READ_BUFFER_BYTES`` of an answer are buffered unread
(a client slower than its engine), the connection stops reading until they are taken.
"""

from __future__ import annotations

import asyncio
import base64
import ssl
from collections import deque
from typing import NamedTuple, cast
from urllib.parse import unquote, urlsplit

import httptools

READ_BUFFER_BYTES = 1024 * 1024
MAX_IDLE_PER_HOST = 256


class UpstreamError(Exception):
    """The engine's connection failed: refused, dropped, or sent what is not HTTP."""


class StaleConnectionError(UpstreamError):
    """A pooled connection closed before any byte of the answer: safe to send again."""


class ConnectRefusedError(UpstreamError):
    """No connection could be made (refused, reset, unreachable; not TLS, not a timeout):
    nothing of the request was sent, so it may go to another engine."""


class _Target(NamedTuple):
    """Where a URL's requests go, and the head every request to it starts with."""

    host: str
    port: int
    tls: bool
    start: bytes  # b"POST /path HTTP/1.1\r\nHost: ...\r\n"


def _target(url: str) -> _Target:
    parts = urlsplit(url)
    tls = parts.scheme == "https"
    host = parts.hostname or ""
    port = parts.port or (443 if tls else 80)
    path = parts.path or "/"
    if parts.query:
        path += "?" + parts.query
    authority = parts.netloc.rsplit("@", 1)[-1]
    start = f"POST {path} HTTP/1.1\r\nHost: {authority}\r\n".encode("latin-1")
    if parts.username is not None or parts.password is not None:
        # Credentials in the backend URL: HTTP Basic, as aiohttp sends them.
        user, password = unquote(parts.username or ""), unquote(parts.password or "")
        token = base64.b64encode(f"{user}:{password}".encode()).decode("ascii")
        start += f"Authorization: Basic {token}\r\n".encode("latin-1")
    return _Target(host, port, tls, start)


class _Connection(asyncio.Protocol):
    """One keep-alive connection to an engine, answering one request at a time."""

    def __init__(self, pool: Http1Pool, key: tuple[str, int, bool]) -> None:
        self.pool = pool
        self.key = key
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.reused = False
        self.one_shot = False  # sent ``Connection: close``: never pooled, whatever the answer
        self.idle_since = 0.0
        self._parser = httptools.HttpResponseParser(self)
        self._response: Http1Response | None = None

    # ------------------------------------------------------------------ asyncio side

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.pool.forget(self)
        response = self._response
        if response is not None:
            response.connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._response is None:  # nothing was asked: not an HTTP/1.1 engine
            self.close()
            return
        self._response.any_byte = True
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError:
            self._response.fail(UpstreamError("the engine sent a malformed HTTP answer"))
            self.close()

    # ------------------------------------------------------------------ httptools callbacks

    def on_message_begin(self) -> None:
        """httptools: an answer starts; a second one to a single request is refused."""
        response = self._response
        assert response is not None
        if response.has_head:
            raise UpstreamError("the engine answered more than it was asked")

    def on_header(self, name: bytes, value: bytes) -> None:
        """httptools: one header of the answer."""
        assert self._response is not None
        self._response.headers[name.decode("latin-1").lower()] = value.decode("latin-1")

    def on_headers_complete(self) -> None:
        """httptools: the head is complete."""
        response = self._response
        assert response is not None
        status = self._parser.get_status_code()
        if 100 <= status < 200:  # an interim answer (100 Continue): the real one follows
            response.headers.clear()
            return
        response.headers_complete(status)

    def on_body(self, body: bytes) -> None:
        """httptools: a piece of the body (chunked encoding already removed)."""
        assert self._response is not None
        self._response.body_received(body)

    def on_message_complete(self) -> None:
        """httptools: the answer is complete."""
        response = self._response
        assert response is not None
        if not response.has_head:  # the end of an interim answer
            return
        response.keep_alive = self._parser.should_keep_alive()
        response.complete()

    # ------------------------------------------------------------------ the pool's side

    def send(self, response: Http1Response, head: bytes, body: bytes) -> None:
        """Write a request whose answer goes to ``response``."""
        assert self.transport is not None
        self._response = response
        self.transport.writelines((head, body))

    def detach(self) -> None:
        """The response is done with this connection."""
        self._response = None

    def pause(self, paused: bool) -> None:
        """Stop or resume reading (flow control)."""
        if self.transport is not None and not self.closed:
            if paused:
                self.transport.pause_reading()
            else:
                self.transport.resume_reading()

    def close(self) -> None:
        """Close the connection (the engine sees the client leave)."""
        self.closed = True
        if self.transport is not None:
            self.transport.close()


class Http1Response:
    """An engine's answer: status and headers at once, the body as it arrives."""

    def __init__(self, connection: _Connection) -> None:
        self.status = 0
        self.headers: dict[str, str] = {}
        self.keep_alive = False
        self._connection: _Connection | None = connection
        self._head: asyncio.Future[None] | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._chunks: deque[bytes] = deque()
        self._buffered = 0
        self._paused = False
        self.any_byte = False
        self.has_head = False
        self._done = False
        self._error: UpstreamError | None = None

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
            if self._error is not None:
                raise self._error
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        chunks = self._chunks
        data = chunks.popleft() if len(chunks) == 1 else b"".join(chunks)
        chunks.clear()
        self._buffered = 0
        if self._paused:
            self._paused = False
            if self._connection is not None:
                self._connection.pause(False)
        return data

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
        if self.has_head:
            return
        if self._error is not None:
            raise self._error
        self._head = asyncio.get_running_loop().create_future()
        try:
            await self._head
        finally:
            self._head = None

    def headers_complete(self, status: int) -> None:
        """The head has been parsed."""
        self.status = status
        self.has_head = True
        self.any_byte = True
        if self._head is not None and not self._head.done():
            self._head.set_result(None)

    def body_received(self, body: bytes) -> None:
        """Buffer a piece of the body, pausing the connection above the limit."""
        self._chunks.append(body)
        self._buffered += len(body)
        if self._buffered > READ_BUFFER_BYTES and not self._paused:
            self._paused = True
            if self._connection is not None:
                self._connection.pause(True)
        self._wake()

    def complete(self) -> None:
        """The body is complete."""
        self._done = True
        self._wake()

    def fail(self, error: UpstreamError) -> None:
        """The answer cannot be completed."""
        if self._done or self._error is not None:
            return
        self._error = error
        if self._head is not None and not self._head.done():
            self._head.set_exception(error)
        self._wake()

    def connection_lost(self, exc: Exception | None) -> None:
        """The connection closed: the end of a body read to EOF if the engine closed it
        cleanly, else a failure."""
        if self._done:
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

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)


class Http1Pool:
    """Keep-alive connections to every engine; ``post`` sends a request on one."""

    def __init__(self, *, connect_timeout_s: float, idle_s: float) -> None:
        self._connect_timeout_s = connect_timeout_s
        self._idle_s = idle_s
        self._targets: dict[str, _Target] = {}
        self._idle: dict[tuple[str, int, bool], list[_Connection]] = {}
        self._open: set[_Connection] = set()
        self._tls: ssl.SSLContext | None = None

    async def post(self, url: str, head: bytes, body: bytes, *, reuse: bool) -> Http1Response:
        """Send ``head`` (headers after the request line and Host, ending in a blank line
        with Content-Length) and ``body`` to ``url``; the answer once its head is in.

        A pooled connection that the engine closed just before reuse is retried once on
        a new connection. ``reuse=False``: a new connection, closed after the answer.
        Raises ``ConnectRefusedError`` (no connection: nothing sent), ``UpstreamError``
        (dropped, not HTTP, TLS) or ``TimeoutError`` (connect).
        """
        target = self._targets.get(url)
        if target is None:
            target = self._targets[url] = _target(url)
        request = target.start + head
        for attempt in range(2):
            # The retry after a stale pooled connection takes a new one: the next pooled
            # one may be just as stale.
            connection = self._pooled(target) if reuse and attempt == 0 else None
            if connection is None:
                try:
                    connection = await self._connect(target)
                except ConnectRefusedError as exc:
                    if attempt:  # the stale connection may have carried it to the engine
                        raise UpstreamError(str(exc)) from exc
                    raise
                connection.one_shot = not reuse
            response = Http1Response(connection)
            connection.send(response, request, body)
            try:
                await response.wait_head()
            except StaleConnectionError:
                response.close()
                if connection.reused:
                    continue
                raise
            except BaseException:
                response.close()
                raise
            return response
        raise UpstreamError("the engine closed the connection")

    def give_back(self, connection: _Connection) -> None:
        """Keep ``connection`` for the next request to its engine."""
        idle = self._idle.setdefault(connection.key, [])
        if len(idle) >= MAX_IDLE_PER_HOST:
            connection.close()
            return
        connection.idle_since = asyncio.get_running_loop().time()
        idle.append(connection)

    def forget(self, connection: _Connection) -> None:
        """``connection`` has closed."""
        self._open.discard(connection)
        idle = self._idle.get(connection.key)
        if idle and connection in idle:
            idle.remove(connection)

    async def close(self) -> None:
        """Close every connection."""
        for connection in list(self._open):
            connection.close()
        self._idle.clear()
        await asyncio.sleep(0)

    def _pooled(self, target: _Target) -> _Connection | None:
        idle = self._idle.get((target.host, target.port, target.tls))
        if not idle:
            return None
        oldest = asyncio.get_running_loop().time() - self._idle_s
        while idle:
            connection = idle.pop()
            if not connection.closed and connection.idle_since > oldest:
                return connection
            connection.close()
        return None

    async def _connect(self, target: _Target) -> _Connection:
        key = (target.host, target.port, target.tls)
        connection = _Connection(self, key)
        tls: ssl.SSLContext | None = None
        if target.tls:
            if self._tls is None:
                self._tls = ssl.create_default_context()
            tls = self._tls
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self._connect_timeout_s):
                await loop.create_connection(
                    lambda: connection,
                    target.host,
                    target.port,
                    ssl=tls,
                    server_hostname=target.host if tls else None,
                )
        except TimeoutError:
            raise  # an OSError too, but a timeout: the caller answers 504
        except ssl.SSLError as exc:
            raise UpstreamError(f"cannot connect: {exc.strerror or exc}") from exc
        except OSError as exc:
            raise ConnectRefusedError(f"cannot connect: {exc.strerror or exc}") from exc
        self._open.add(connection)
        return connection
