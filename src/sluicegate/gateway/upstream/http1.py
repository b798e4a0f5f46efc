"""A lean HTTP/1.1 client for the engines: a keep-alive pool of asyncio protocols, parsed
by httptools (llhttp, the parser uvicorn already uses).

The gateway sends one kind of request to engines: a POST with a JSON body, answered with
JSON or an event stream. For that, aiohttp's client cost about a fifth of the gateway's
CPU per request (``ClientRequest``/``ClientResponse`` objects, payload registry, a
``StreamReader`` and several futures per request; docs/BENCHMARKS.md, issue 18). Here a
request is one ``writelines`` of a pre-built head and the body, and the answer is parsed
in ``data_received`` straight into the response's buffer: one future for the head, one
per wait for more body.

The answer itself, its flow control and the client's errors are in ``http1_response.py``.

Bounds (``UpstreamLimits``): an answer's head is counted before httptools sees it
(httptools joins a header value that arrives over many reads by concatenation, so an
unbounded one costs quadratic CPU), across interim (1xx) answers too; header fields and
interim answers are counted; a body read whole is capped as it arrives
(``Http1Response.limit_body``); and bytes of chunk framing or trailers with no body
between them count against the head cap. Over a cap, or on anything that is not one
HTTP answer to the request sent (a malformed answer, a ``101``, a second answer, bytes
on an idle connection, another request's ``X-Request-Id``), the connection is closed,
never pooled, and the reader gets an ``UpstreamProtocolError`` whose ``code`` names
what happened.
"""

from __future__ import annotations

import asyncio
import base64
import ssl
from typing import NamedTuple, cast
from urllib.parse import unquote, urlsplit

import httptools

from sluicegate.gateway.upstream.http1_response import (
    READ_BUFFER_BYTES,
    Http1Response,
    StaleConnectionError,
    UpstreamError,
    UpstreamProtocolError,
)

__all__ = [
    "READ_BUFFER_BYTES",
    "Http1Pool",
    "Http1Response",
    "StaleConnectionError",
    "UpstreamError",
    "UpstreamLimits",
    "UpstreamProtocolError",
]

MAX_IDLE_PER_HOST = 256
MAX_INTERIM_ANSWERS = 8
"""Interim (1xx) answers accepted before the final one (engines send one at most)."""


class UpstreamLimits(NamedTuple):
    """Caps on an engine's answer (``server.max_upstream_*``)."""

    head_bytes: int = 64 * 1024  # status lines and headers, interim answers included
    headers: int = 100  # header fields, interim answers' and trailers included
    body_bytes: int = 256 * 1024 * 1024  # a body read whole (``Http1Response.limit_body``)


def _head_too_large(what: str) -> UpstreamProtocolError:
    return UpstreamProtocolError("upstream_head_too_large", f"the engine's answer has {what}")


def _protocol_error(message: str) -> UpstreamProtocolError:
    return UpstreamProtocolError("upstream_protocol_error", message)


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
        # What the current answer may still send: head bytes (then, once the head is in,
        # framing bytes without body), header fields, interim answers.
        self._room = 0
        self._fields = 0
        self._interim = 0
        self._head_cap = pool.limits.head_bytes

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
        response = self._response
        if response is None:  # nothing was asked (an idle pooled connection): not trusted
            self.close()
            return
        response.any_byte = True
        try:
            if response.has_head:
                received = response.received
                self._parser.feed_data(data)
                if response.received != received:
                    self._room = self._head_cap
                else:  # no body in this read: chunk framing or trailers only
                    self._room -= len(data)
                    if self._room < 0:
                        raise _head_too_large("chunk framing or trailers over the head cap")
            else:
                self._feed_head(response, data)
        except UpstreamError as exc:
            self._refuse(response, exc)
        except httptools.HttpParserUpgrade:
            self._refuse(response, _protocol_error("the engine switched protocols"))
        except httptools.HttpParserError as exc:
            cause = exc.__context__  # an exception a callback raised
            if not isinstance(cause, UpstreamError):
                cause = _protocol_error("the engine sent a malformed HTTP answer")
            self._refuse(response, cause)

    def _feed_head(self, response: Http1Response, data: bytes) -> None:
        """Parse a read that starts in the head, never more head bytes than the cap."""
        room = self._room
        if len(data) <= room:
            self._room = room - len(data)
            self._parser.feed_data(data)
            return
        self._parser.feed_data(data[:room])
        if not response.has_head:
            raise _head_too_large(f"a head over {self.pool.limits.head_bytes} bytes")
        self._room = self._head_cap
        self._parser.feed_data(data[room:])

    def _refuse(self, response: Http1Response, error: UpstreamError) -> None:
        """The answer broke a cap or HTTP: it fails, and the connection closes."""
        response.fail(error, discard=True)
        self.close()

    # ------------------------------------------------------------------ httptools callbacks

    def on_message_begin(self) -> None:
        """httptools: an answer starts; a second one to a single request is refused."""
        response = self._response
        assert response is not None
        if response.has_head:
            raise _protocol_error("the engine answered more than it was asked")

    def on_header(self, name: bytes, value: bytes) -> None:
        """httptools: one header of the answer."""
        assert self._response is not None
        self._fields -= 1
        if self._fields < 0:
            raise _head_too_large(f"more than {self.pool.limits.headers} header fields")
        self._response.headers[name.decode("latin-1").lower()] = value.decode("latin-1")

    def on_headers_complete(self) -> None:
        """httptools: the head is complete."""
        response = self._response
        assert response is not None
        status = self._parser.get_status_code()
        if status == 101:
            raise _protocol_error("the engine switched protocols (101)")
        if 100 <= status < 200:  # an interim answer (100 Continue): the real one follows
            self._interim -= 1
            if self._interim < 0:
                raise _head_too_large(f"more than {MAX_INTERIM_ANSWERS} interim (1xx) answers")
            response.headers.clear()
            return
        echoed = response.headers.get("x-request-id")
        sent = response.request_id
        if echoed is not None and sent and echoed != sent and echoed[:8] == sent[:8]:
            # An engine that echoes request ids (vLLM's --enable-request-id-headers) says
            # whose answer this is: another request's is never this one's. Only an id of
            # this process's shape (same prefix) counts, so a proxy in between that
            # writes ids of its own into answers is not mistaken for a stray answer.
            raise _protocol_error("the engine's answer is for another request")
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
        self._room = self._head_cap
        self._fields = self.pool.limits.headers
        self._interim = MAX_INTERIM_ANSWERS
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
        """Close the connection (the engine sees the client leave); it leaves the pool."""
        self.closed = True
        self.pool.forget(self)
        if self.transport is not None:
            self.transport.close()


class Http1Pool:
    """Keep-alive connections to every engine; ``post`` sends a request on one."""

    def __init__(
        self, *, connect_timeout_s: float, idle_s: float, limits: UpstreamLimits | None = None
    ) -> None:
        self._connect_timeout_s = connect_timeout_s
        self._idle_s = idle_s
        self.limits = limits or UpstreamLimits()
        self._targets: dict[str, _Target] = {}
        self._idle: dict[tuple[str, int, bool], list[_Connection]] = {}
        self._open: set[_Connection] = set()
        self._tls: ssl.SSLContext | None = None

    async def post(
        self, url: str, head: bytes, body: bytes, *, reuse: bool, request_id: str = ""
    ) -> Http1Response:
        """Send ``head`` (headers after the request line and Host, ending in a blank line
        with Content-Length) and ``body`` to ``url``; the answer once its head is in.
        ``request_id``: the ``X-Request-Id`` in ``head``, which an answer that echoes one
        must carry.

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
            response = Http1Response(connection, request_id)
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
