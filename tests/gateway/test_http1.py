"""The engines' HTTP/1.1 client (``gateway.http1``) against real servers on loopback.

Most servers here are ``RawServer``: an asyncio server whose handler writes exact bytes
(bodies without a length, chunks split at odd places, cuts, garbage) and that counts the
connections it accepted and the ones it saw the client leave. A few tests talk to an
aiohttp server, the kind of HTTP stack engines run. The key behaviours run on uvloop too,
the gateway's loop (``test_key_behaviours_on_uvloop``).
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import socket
import struct
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from contextlib import asynccontextmanager
from typing import Any

import pytest
import uvloop
from aiohttp import web

from sluicegate.gateway.http_errors import GatewayError
from sluicegate.gateway.upstream.clients import Upstream
from sluicegate.gateway.upstream.http1 import (
    READ_BUFFER_BYTES,
    Http1Pool,
    StaleConnectionError,
    UpstreamError,
)
from tests.hardening.test_upstream_faults import blackhole

BODY = b'{"prompt": "hi"}'
HEAD = b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(BODY)
CLOSE_HEAD = b"Content-Length: %d\r\nConnection: close\r\n\r\n" % len(BODY)
OK = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}"
MARGIN_S = 1.0  # a loaded 2-core machine
HANG_S = 0.3  # how long a known bug's hang is waited for
READ_CHUNK_BYTES = 256 * 1024  # the most one socket read hands over (asyncio 256 KiB, uvloop less)


class RawServer:
    """A loopback server whose ``handler`` writes exact bytes; it counts the connections it
    accepted and the ones whose client left (EOF seen by ``read_request``/``wait_eof``)."""

    def __init__(self, handler: Callable[[RawServer, Conn], Awaitable[None]]) -> None:
        self.handler = handler
        self.accepted = 0
        self.client_left = 0
        self.requests: list[bytes] = []  # request heads, in arrival order
        self.conns: list[Conn] = []
        self.url = ""

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """One accepted connection."""
        self.accepted += 1
        conn = Conn(self, reader, writer)
        self.conns.append(conn)
        try:
            await self.handler(self, conn)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()


class Conn:
    """The server's side of one connection."""

    def __init__(
        self, server: RawServer, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        self.server = server
        self.reader = reader
        self.writer = writer
        self.left = asyncio.Event()  # the client closed its side

    async def read_request(self) -> bytes | None:
        """The next request's head (its body read and dropped); ``None`` if the client left."""
        try:
            head = await self.reader.readuntil(b"\r\n\r\n")
        except asyncio.IncompleteReadError:
            self._note_left()
            return None
        length = 0
        for line in head.split(b"\r\n"):
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value)
        await self.reader.readexactly(length)
        self.server.requests.append(head)
        return head

    async def wait_eof(self) -> None:
        """Read until the client closes its side."""
        while await self.reader.read(65536):
            pass
        self._note_left()

    def _note_left(self) -> None:
        if not self.left.is_set():
            self.left.set()
            self.server.client_left += 1

    async def send(self, *pieces: bytes, pause_s: float = 0.0) -> None:
        """Write ``pieces`` one by one, each flushed (and ``pause_s`` apart)."""
        for piece in pieces:
            self.writer.write(piece)
            await self.writer.drain()
            if pause_s:
                await asyncio.sleep(pause_s)


@asynccontextmanager
async def raw_server(
    handler: Callable[[RawServer, Conn], Awaitable[None]],
) -> AsyncIterator[RawServer]:
    """Run a ``RawServer`` on a free loopback port; ``server.url`` is where it listens."""
    server = RawServer(handler)
    listener = await asyncio.start_server(server.serve, "127.0.0.1", 0)
    port = listener.sockets[0].getsockname()[1]
    server.url = f"http://127.0.0.1:{port}/v1/completions"
    try:
        yield server
    finally:
        listener.close()
        for conn in server.conns:
            conn.writer.close()
        await listener.wait_closed()
        await asyncio.sleep(0.01)  # let the handlers see their connections close


@asynccontextmanager
async def open_pool(
    *, connect_timeout_s: float = 5.0, idle_s: float = 4.0
) -> AsyncIterator[Http1Pool]:
    """An ``Http1Pool``, closed at the end."""
    pool = Http1Pool(connect_timeout_s=connect_timeout_s, idle_s=idle_s)
    try:
        yield pool
    finally:
        await pool.close()


@asynccontextmanager
async def aiohttp_engine(
    completions: Callable[[web.Request], Awaitable[web.StreamResponse]],
) -> AsyncIterator[int]:
    """An aiohttp server on a free loopback port whose ``POST /v1/completions`` is
    ``completions``; yields the port, cleaned up at the end."""
    app = web.Application()
    app.router.add_post("/v1/completions", completions)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    try:
        yield runner.addresses[0][1]
    finally:
        await runner.cleanup()


def answering(answer: bytes) -> Callable[[RawServer, Conn], Awaitable[None]]:
    """A keep-alive handler giving ``answer`` to every request on a connection."""

    async def handler(server: RawServer, conn: Conn) -> None:
        while await conn.read_request() is not None:
            await conn.send(answer)

    return handler


async def wait_for_state(predicate: Callable[[], bool], timeout_s: float = MARGIN_S) -> None:
    """Yield to the loop until ``predicate()`` holds; fail after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.005)


async def post_and_read(pool: Http1Pool, url: str, head: bytes = HEAD) -> tuple[int, bytes]:
    """One whole exchange; the connection released as the gateway does."""
    response = await pool.post(url, head, BODY, reuse=True)
    try:
        return response.status, await response.read()
    finally:
        response.release()


def free_port() -> int:
    """A loopback port nothing listens on."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# ---------------------------------------------------------------------------------- bodies


async def test_content_length_body_from_aiohttp() -> None:
    """An aiohttp engine's Content-Length answer: status, headers and exactly the body's
    bytes; the request arrived as sent (path, Host, body)."""
    payload = os.urandom(300_000)
    seen: list[tuple[str, str, bytes]] = []

    async def completions(request: web.Request) -> web.Response:
        seen.append((request.path_qs, request.host, await request.read()))
        return web.Response(body=payload, content_type="application/json")

    async with aiohttp_engine(completions) as port, open_pool() as pool:
        url = f"http://127.0.0.1:{port}/v1/completions?x=1"
        response = await pool.post(url, HEAD, BODY, reuse=True)
        assert response.status == 200
        assert response.content_type == "application/json"
        assert response.headers["content-length"] == str(len(payload))
        assert await response.read() == payload
        assert await response.readany() == b""
        assert await response.readany() == b""
        response.release()
    assert seen == [("/v1/completions?x=1", f"127.0.0.1:{port}", BODY)]


async def test_credentials_in_the_url_are_sent_as_basic_auth() -> None:
    """``http://user:p%40ss@host/...``: the request carries ``Authorization: Basic`` with
    the decoded user and password (as aiohttp sent them), and the Host header has no
    credentials."""
    async with raw_server(answering(OK)) as server, open_pool() as pool:
        url = server.url.replace("http://", "http://bob:p%40ss@")
        assert (await post_and_read(pool, url))[0] == 200
    head = server.requests[0].decode("latin-1")
    assert "\r\nAuthorization: Basic Ym9iOnBAc3M=\r\n" in head, head  # bob:p@ss
    assert "bob" not in head.split("\r\nHost: ", 1)[1].split("\r\n", 1)[0]


async def test_chunked_body_split_at_odd_places_is_decoded() -> None:
    """A chunked answer whose bytes arrive split inside the size line, inside the CRLFs and
    inside the data (with a chunk extension and a trailer) reads as exactly the decoded
    body, and the connection is kept for the next request."""
    wire = (
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"5;ext=1\r\nhello\r\n"
        b"1A\r\nabcdefghijklmnopqrstuvwxyz\r\n"
        b"1\r\n\n\r\n"
        b"0\r\nX-Trailer: t\r\n\r\n"
    )
    cuts = [3, 40, 47, 49, 51, 55, 57, 58, 66, 70, 98, 100, 101, 104, 105, len(wire) - 1]

    async def handler(server: RawServer, conn: Conn) -> None:
        while await conn.read_request() is not None:
            pieces = [wire[a:b] for a, b in zip([0, *cuts], [*cuts, len(wire)], strict=True)]
            await conn.send(*pieces, pause_s=0.002)

    async with raw_server(handler) as server, open_pool() as pool:
        assert await post_and_read(pool, server.url) == (200, b"helloabcdefghijklmnopqrstuvwxyz\n")
        assert await post_and_read(pool, server.url) == (200, b"helloabcdefghijklmnopqrstuvwxyz\n")
        assert server.accepted == 1


async def test_body_without_length_reads_to_eof_and_is_not_pooled() -> None:
    """An answer with neither Content-Length nor chunked ends when the engine closes: read()
    returns exactly the bytes sent, readany() then b""; the next request opens a new
    connection."""
    payload = os.urandom(200_000)

    async def handler(server: RawServer, conn: Conn) -> None:
        await conn.read_request()
        await conn.send(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\n", payload[:1000])
        await conn.send(payload[1000:])

    async with raw_server(handler) as server, open_pool() as pool:
        for _ in range(2):
            response = await pool.post(server.url, HEAD, BODY, reuse=True)
            assert await response.read() == payload
            assert await response.readany() == b""
            response.release()
        assert server.accepted == 2


def lockstep_stream(
    pieces: list[bytes], got: list[asyncio.Event]
) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
    """An aiohttp handler streaming ``pieces``, each written only once the client set
    the ``got`` event of the one before."""

    async def events(request: web.Request) -> web.StreamResponse:
        await request.read()
        stream = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await stream.prepare(request)
        for piece, event in zip(pieces, got, strict=True):
            await stream.write(piece)
            await asyncio.wait_for(event.wait(), MARGIN_S)
        await stream.write_eof()
        return stream

    return events


async def test_stream_arrives_piece_by_piece() -> None:
    """readany() hands over each piece of a stream as it arrives: the engine sends the next
    piece only after the client got the previous one, so nothing waits for the end."""
    pieces = [b"data: %d\n\n" % i for i in range(5)]
    got: list[asyncio.Event] = [asyncio.Event() for _ in pieces]

    async with aiohttp_engine(lockstep_stream(pieces, got)) as port, open_pool() as pool:
        response = await pool.post(
            f"http://127.0.0.1:{port}/v1/completions", HEAD, BODY, reuse=True
        )
        assert response.content_type == "text/event-stream"
        for piece, event in zip(pieces, got, strict=True):
            assert await asyncio.wait_for(response.readany(), MARGIN_S) == piece
            event.set()
        assert await asyncio.wait_for(response.readany(), MARGIN_S) == b""
        response.release()


# ---------------------------------------------------------------------------------- keep-alive


async def test_keep_alive_reuses_one_connection_to_aiohttp() -> None:
    """Three sequential requests to an aiohttp engine go over one TCP connection."""
    peers: list[object] = []

    async def completions(request: web.Request) -> web.Response:
        assert request.transport is not None
        peers.append(request.transport.get_extra_info("peername"))
        await request.read()
        return web.json_response({"n": len(peers)})

    async with aiohttp_engine(completions) as port, open_pool() as pool:
        url = f"http://127.0.0.1:{port}/v1/completions"
        answers = [await post_and_read(pool, url) for _ in range(3)]
    assert answers == [(200, b'{"n": 1}'), (200, b'{"n": 2}'), (200, b'{"n": 3}')]
    assert len(peers) == 3
    assert len(set(peers)) == 1


async def test_keep_alive_reuses_one_connection() -> None:
    """Two sequential posts to one engine use one TCP connection."""
    async with raw_server(answering(OK)) as server, open_pool() as pool:
        assert await post_and_read(pool, server.url) == (200, b"{}")
        assert await post_and_read(pool, server.url) == (200, b"{}")
        assert server.accepted == 1
        assert len(server.requests) == 2


async def test_reuse_false_sends_connection_close_and_opens_a_connection_each_time() -> None:
    """``Upstream.post(reuse=False)`` says ``Connection: close`` and opens a new connection
    for each request (the engine closes each after its answer)."""

    async def handler(server: RawServer, conn: Conn) -> None:
        head = await conn.read_request()
        assert head is not None
        await conn.send(OK)  # and close, as asked

    upstream = Upstream(connect_timeout_s=5.0)
    await upstream.start()
    try:
        async with raw_server(handler) as server:
            for request_id in ("r1", "r2"):
                response = await upstream.post(server.url, BODY, request_id, reuse=False)
                assert await upstream.read(response) == b"{}"
                response.release()
            assert server.accepted == 2
            heads = [head.lower() for head in server.requests]
            assert all(b"\r\nconnection: close\r\n" in head for head in heads), heads
            assert [b"x-request-id: r1\r\n" in heads[0], b"x-request-id: r2\r\n" in heads[1]] == [
                True,
                True,
            ]
    finally:
        await upstream.close()


async def test_answer_with_connection_close_is_not_pooled() -> None:
    """An answer saying ``Connection: close`` (from an engine that then leaves the socket
    open) is not pooled: the client closes it and the next request opens a new one."""
    answer = b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\n{}"
    async with raw_server(answering(answer)) as server, open_pool() as pool:
        assert await post_and_read(pool, server.url) == (200, b"{}")
        await wait_for_state(lambda: server.client_left == 1)
        assert await post_and_read(pool, server.url) == (200, b"{}")
        assert server.accepted == 2


async def test_connection_the_engine_closed_while_idle_is_not_used() -> None:
    """A pooled connection the engine closed while it sat idle (and the client noticed) is
    dropped: the next post goes over a new connection."""

    async def handler(server: RawServer, conn: Conn) -> None:
        await conn.read_request()
        await conn.send(OK)
        await asyncio.sleep(0.02)  # then an idle timeout closes it

    async with raw_server(handler) as server, open_pool() as pool:
        assert await post_and_read(pool, server.url) == (200, b"{}")
        await asyncio.sleep(0.15)
        assert await post_and_read(pool, server.url) == (200, b"{}")
        assert server.accepted == 2


async def _answer_once_then_drop(server: RawServer, conn: Conn) -> None:
    """Answer the first request on a connection; on the next, close without answering (an
    engine closing a keep-alive connection just as the client reuses it)."""
    await conn.read_request()
    await conn.send(OK)
    await conn.read_request()


async def test_stale_pooled_connection_is_retried_on_a_new_one() -> None:
    """A pooled connection that closes as it is reused, before any byte of the answer, is
    retried once on a new connection: the post succeeds."""
    async with raw_server(_answer_once_then_drop) as server, open_pool() as pool:
        assert await post_and_read(pool, server.url) == (200, b"{}")
        assert await post_and_read(pool, server.url) == (200, b"{}")
        assert server.accepted == 2
        assert len(server.requests) == 3


async def test_stale_retry_goes_to_a_new_connection_even_with_more_pooled() -> None:
    """With two pooled connections that both close as they are reused, a post still
    succeeds: its one retry goes over a new connection, as ``post`` documents."""
    async with raw_server(_answer_once_then_drop) as server, open_pool() as pool:
        first = await pool.post(server.url, HEAD, BODY, reuse=True)
        second = await pool.post(server.url, HEAD, BODY, reuse=True)
        for response in (first, second):
            assert await response.read() == b"{}"
            response.release()
        assert server.accepted == 2
        assert await post_and_read(pool, server.url) == (200, b"{}")


async def test_fresh_connection_closed_before_any_byte_raises() -> None:
    """A new connection closed before any byte of the answer raises UpstreamError, once:
    it is not retried (one connection accepted)."""

    async def handler(server: RawServer, conn: Conn) -> None:
        await conn.read_request()

    async with raw_server(handler) as server, open_pool() as pool:
        with pytest.raises(UpstreamError):
            await pool.post(server.url, HEAD, BODY, reuse=True)
        with pytest.raises(UpstreamError):
            await pool.post(server.url, HEAD, BODY, reuse=False)
        assert server.accepted == 2
        assert len(server.requests) == 2


async def test_idle_connection_past_idle_s_is_not_reused() -> None:
    """A connection idle for less than ``idle_s`` is reused; one idle for longer is closed
    and the request goes over a new connection."""
    async with raw_server(answering(OK)) as server, open_pool(idle_s=0.2) as pool:
        assert await post_and_read(pool, server.url) == (200, b"{}")
        assert await post_and_read(pool, server.url) == (200, b"{}")
        assert server.accepted == 1
        await asyncio.sleep(0.3)
        assert await post_and_read(pool, server.url) == (200, b"{}")
        assert server.accepted == 2
        await wait_for_state(lambda: server.conns[0].left.is_set())


# ---------------------------------------------------------------------------------- failures


async def test_answer_cut_mid_body_raises_from_read() -> None:
    """An answer whose connection closes mid-body (Content-Length or chunked) raises
    UpstreamError from read() after the head came in; ``Upstream.read`` makes it a 502."""
    answers = [
        b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n" + b"x" * 10,
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n5\r\nwo",
    ]

    async def handler(server: RawServer, conn: Conn) -> None:
        await conn.read_request()
        await conn.send(answers[server.accepted - 1])

    upstream = Upstream(connect_timeout_s=5.0)
    await upstream.start()
    try:
        async with raw_server(handler) as server, open_pool() as pool:
            response = await pool.post(server.url, HEAD, BODY, reuse=True)
            assert response.status == 200
            with pytest.raises(UpstreamError):
                await response.read()
            response.release()
            response = await upstream.post(server.url, BODY, "r", reuse=True)
            with pytest.raises(GatewayError) as raised:
                await upstream.read(response)
            assert (raised.value.status, raised.value.code) == (502, "upstream_error")
            response.release()
    finally:
        await upstream.close()


@pytest.mark.parametrize(
    "answer",
    [
        b"HTTP/1.1 abc OK\r\n\r\n",
        b"SSH-2.0-OpenSSH_9.6\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: 12x\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\n{}",
    ],
    ids=["status", "not-http", "length", "two-lengths"],
)
async def test_malformed_head_raises_from_post(answer: bytes) -> None:
    """A head that is not valid HTTP raises UpstreamError from post, not retried."""

    async def handler(server: RawServer, conn: Conn) -> None:
        await conn.read_request()
        await conn.send(answer)
        await conn.wait_eof()

    async with raw_server(handler) as server, open_pool() as pool:
        with pytest.raises(UpstreamError) as raised:
            await pool.post(server.url, HEAD, BODY, reuse=True)
        assert not isinstance(raised.value, StaleConnectionError)
        assert server.accepted == 1
        await wait_for_state(lambda: server.client_left == 1)


async def test_malformed_chunk_raises_from_read() -> None:
    """A chunked body with a bad chunk size raises UpstreamError from read(), and the
    client closes the connection."""
    answer = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\nzz\r\n"

    async def handler(server: RawServer, conn: Conn) -> None:
        await conn.read_request()
        await conn.send(answer)
        await conn.wait_eof()

    async with raw_server(handler) as server, open_pool() as pool:
        response = await pool.post(server.url, HEAD, BODY, reuse=True)
        with pytest.raises(UpstreamError):
            await response.read()
        response.release()
        await wait_for_state(lambda: server.client_left == 1)


async def _gateway_error(url: str, *, connect_timeout_s: float) -> tuple[int, str]:
    """The status and code of the ``GatewayError`` ``Upstream.post`` raises for ``url``."""
    upstream = Upstream(connect_timeout_s=connect_timeout_s)
    await upstream.start()
    try:
        with pytest.raises(GatewayError) as raised:
            await upstream.post(url, BODY, "r")
    finally:
        await upstream.close()
    return raised.value.status, raised.value.code


async def test_connect_refused_raises_quickly() -> None:
    """A refused connection raises UpstreamError at once (well within the 5 s connect
    timeout); through ``Upstream`` it is a 502."""
    url = f"http://127.0.0.1:{free_port()}/v1/completions"
    async with open_pool(connect_timeout_s=5.0) as pool:
        started = time.monotonic()
        with pytest.raises(UpstreamError):
            await pool.post(url, HEAD, BODY, reuse=True)
        assert time.monotonic() - started < MARGIN_S
    assert await _gateway_error(url, connect_timeout_s=5.0) == (502, "upstream_unavailable")


async def test_connect_that_hangs_times_out_after_connect_timeout() -> None:
    """A listener that never accepts (full backlog) makes post raise TimeoutError after
    ``connect_timeout_s`` (not before, not much after); ``Upstream.post`` makes it a 504."""
    timeout_s = 0.2
    with blackhole() as port:
        url = f"http://127.0.0.1:{port}/v1/completions"
        async with open_pool(connect_timeout_s=timeout_s) as pool:
            started = time.monotonic()
            with pytest.raises(TimeoutError):
                await pool.post(url, HEAD, BODY, reuse=True)
            elapsed = time.monotonic() - started
        assert timeout_s <= elapsed < timeout_s + MARGIN_S
        assert await _gateway_error(url, connect_timeout_s=timeout_s) == (504, "upstream_timeout")


# ---------------------------------------------------------------------------------- flow control


async def test_unread_answer_pauses_the_connection() -> None:
    """An engine sending 24 MiB to a client that does not read: the client stops reading
    (the engine's writes stay buffered, and the first read hands over at most
    READ_BUFFER_BYTES plus one socket read); reading it all then yields every byte intact."""
    payload = os.urandom(24 * 1024 * 1024)
    stalled = asyncio.Event()
    unsent: list[int] = []

    async def handler(server: RawServer, conn: Conn) -> None:
        await conn.read_request()
        conn.writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(payload))
        conn.writer.write(payload)
        await asyncio.sleep(0.3)  # the client reads nothing meanwhile
        unsent.append(conn.writer.transport.get_write_buffer_size())
        stalled.set()
        await conn.writer.drain()
        await conn.wait_eof()

    async with raw_server(handler) as server, open_pool() as pool:
        response = await pool.post(server.url, HEAD, BODY, reuse=True)
        await asyncio.wait_for(stalled.wait(), MARGIN_S * 3)
        assert unsent[0] > 0  # the engine could not hand everything over
        first = await response.readany()
        assert 0 < len(first) <= READ_BUFFER_BYTES + READ_CHUNK_BYTES
        rest = await response.read()
        assert hashlib.sha256(first + rest).digest() == hashlib.sha256(payload).digest()
        response.release()
        assert server.accepted == 1


# ---------------------------------------------------------------------------------- closing


async def test_closing_a_response_mid_body_closes_its_connection() -> None:
    """``close()`` on a half-read answer closes its connection (the engine sees the client
    leave) and the next request opens a new one."""

    async def handler(server: RawServer, conn: Conn) -> None:
        await conn.read_request()
        await conn.send(b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n", b"x" * 10)
        await conn.wait_eof()

    async with raw_server(handler) as server, open_pool() as pool:
        response = await pool.post(server.url, HEAD, BODY, reuse=True)
        assert await response.readany() == b"x" * 10
        response.close()
        await wait_for_state(lambda: server.client_left == 1)
        second = await pool.post(server.url, HEAD, BODY, reuse=True)
        second.close()
        assert server.accepted == 2


async def test_pool_close_closes_idle_and_busy_connections() -> None:
    """``Http1Pool.close()`` closes every connection, pooled or mid-answer: the engine sees
    both leave and the half-read answer raises UpstreamError."""

    async def handler(server: RawServer, conn: Conn) -> None:
        await conn.read_request()
        if server.accepted == 1:
            await conn.send(OK)
        else:
            await conn.send(b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n", b"x" * 10)
        await conn.wait_eof()

    async with raw_server(handler) as server:
        pool = Http1Pool(connect_timeout_s=5.0, idle_s=4.0)
        assert await post_and_read(pool, server.url) == (200, b"{}")  # now idle in the pool
        busy = await pool.post(server.url, HEAD, BODY, reuse=False)
        assert await busy.readany() == b"x" * 10
        assert server.accepted == 2
        await pool.close()
        await wait_for_state(lambda: server.client_left == 2)
        with pytest.raises(UpstreamError):
            await busy.read()
        busy.close()


# ---------------------------------------------------------------------------------- known bugs


async def test_bytes_after_a_complete_answer_are_not_part_of_it() -> None:
    """An engine that sends a second answer after the first (one request) does not get it
    appended to the first answer's body; the connection is not kept."""
    first = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nhi"
    extra = first + b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nbye"
    async with raw_server(answering(extra)) as server, open_pool() as pool:
        response = await pool.post(server.url, HEAD, BODY, reuse=True)
        await asyncio.sleep(0.05)  # both answers are in
        assert await response.read() == b"hi"
        response.release()


async def test_interim_answer_is_skipped() -> None:
    """A ``100 Continue`` ahead of the answer is not the answer: post returns the 200 and
    its body."""

    async def handler(server: RawServer, conn: Conn) -> None:
        await conn.read_request()
        await conn.send(b"HTTP/1.1 100 Continue\r\n\r\n", OK, pause_s=0.05)
        await conn.wait_eof()

    async with raw_server(handler) as server, open_pool() as pool:
        response = await pool.post(server.url, HEAD, BODY, reuse=True)
        try:
            assert response.status == 200
            assert await asyncio.wait_for(response.read(), MARGIN_S) == b"{}"
        finally:
            response.close()


async def test_close_wakes_a_waiting_reader() -> None:
    """A task waiting in readany() when another closes the answer is woken (UpstreamError
    or the end), instead of waiting forever."""

    async def handler(server: RawServer, conn: Conn) -> None:
        await conn.read_request()
        await conn.send(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nx")
        await conn.wait_eof()

    async with raw_server(handler) as server, open_pool() as pool:
        response = await pool.post(server.url, HEAD, BODY, reuse=True)
        assert await response.readany() == b"x"
        reader = asyncio.create_task(response.readany())
        await asyncio.sleep(0.01)
        response.close()
        done, _ = await asyncio.wait([reader], timeout=HANG_S)
        reader.cancel()
        assert done, "the reader still waits"
        assert isinstance(reader.exception(), UpstreamError) or reader.result() == b""


async def test_released_answer_over_the_buffer_limit_leaves_a_working_connection() -> None:
    """An answer that arrived whole but unread, just above READ_BUFFER_BYTES, then
    released: the pooled connection still reads, so the next request is answered."""
    size = READ_BUFFER_BYTES + 1  # the read that crosses the limit also ends the body

    async def handler(server: RawServer, conn: Conn) -> None:
        await conn.read_request()
        await conn.send(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % size + b"x" * size)
        while await conn.read_request() is not None:
            await conn.send(OK)

    async with raw_server(handler) as server, open_pool() as pool:
        response = await pool.post(server.url, HEAD, BODY, reuse=True)
        await asyncio.sleep(0.2)  # all of it is in, unread
        response.release()
        assert await asyncio.wait_for(post_and_read(pool, server.url), HANG_S) == (200, b"{}")


async def test_reuse_false_connection_is_never_pooled() -> None:
    """``reuse=False`` (a connection of its own, closed after the answer) holds even when
    the engine ignores ``Connection: close`` and answers keep-alive: the client closes it
    and a later request does not get it."""
    async with raw_server(answering(OK)) as server, open_pool() as pool:
        response = await pool.post(server.url, CLOSE_HEAD, BODY, reuse=False)
        assert await response.read() == b"{}"
        response.release()
        await wait_for_state(lambda: server.client_left == 1, HANG_S)
        assert await post_and_read(pool, server.url) == (200, b"{}")
        assert server.accepted == 2


async def test_reset_during_a_body_read_to_eof_raises() -> None:
    """An answer without a length ends at a clean close; a connection reset (RST) instead
    means it was cut: read() raises UpstreamError rather than return the truncated bytes."""

    async def handler(server: RawServer, conn: Conn) -> None:
        await conn.read_request()
        await conn.send(b"HTTP/1.1 200 OK\r\n\r\n" + b"x" * 10)
        await asyncio.sleep(0.05)
        sock = conn.writer.get_extra_info("socket")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        conn.writer.transport.abort()

    async with raw_server(handler) as server, open_pool() as pool:
        response = await pool.post(server.url, HEAD, BODY, reuse=True)
        try:
            with pytest.raises(UpstreamError):
                await response.read()
        finally:
            response.close()


# ---------------------------------------------------------------------------------- uvloop

KEY_BEHAVIOURS: list[Callable[[], Coroutine[Any, Any, None]]] = [
    test_chunked_body_split_at_odd_places_is_decoded,
    test_body_without_length_reads_to_eof_and_is_not_pooled,
    test_stream_arrives_piece_by_piece,
    test_keep_alive_reuses_one_connection,
    test_answer_with_connection_close_is_not_pooled,
    test_stale_pooled_connection_is_retried_on_a_new_one,
    test_fresh_connection_closed_before_any_byte_raises,
    test_answer_cut_mid_body_raises_from_read,
    test_malformed_chunk_raises_from_read,
    test_connect_refused_raises_quickly,
    test_unread_answer_pauses_the_connection,
    test_closing_a_response_mid_body_closes_its_connection,
    test_pool_close_closes_idle_and_busy_connections,
]


@pytest.mark.parametrize("behaviour", KEY_BEHAVIOURS, ids=lambda test: test.__name__[5:])
def test_key_behaviours_on_uvloop(behaviour: Callable[[], Coroutine[Any, Any, None]]) -> None:
    """The same behaviours on uvloop, the gateway's loop: its transports pause, write and
    report closes their own way."""
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(behaviour())
