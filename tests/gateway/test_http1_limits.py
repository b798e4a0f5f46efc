"""The engines' HTTP/1.1 client (``gateway.http1``) under hostile answers: the head, header
field, interim-answer and body caps, a ``101``, trailers, bytes on an idle connection and
another request's answer. Servers are ``test_http1.RawServer``s writing exact bytes.

Over a cap, the client raises ``UpstreamProtocolError`` whose ``code`` names the cap, and
closes the connection (the server sees the client leave); ``Upstream`` turns that into a
502 with the same code.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable, Coroutine
from contextlib import asynccontextmanager
from typing import Any

import pytest
import uvloop

from sluicegate.gateway.http_errors import GatewayError
from sluicegate.gateway.upstream.clients import Upstream
from sluicegate.gateway.upstream.http1 import (
    Http1Pool,
    UpstreamLimits,
    UpstreamProtocolError,
)
from tests.gateway.test_http1 import (
    BODY,
    HEAD,
    MARGIN_S,
    OK,
    Conn,
    RawServer,
    answering,
    post_and_read,
    raw_server,
    wait_for_state,
)

HEADER_BYTES = 1024
LIMITS = UpstreamLimits(head_bytes=HEADER_BYTES, headers=8, body_bytes=64 * 1024)


@asynccontextmanager
async def capped_pool(limits: UpstreamLimits = LIMITS) -> AsyncIterator[Http1Pool]:
    """An ``Http1Pool`` with ``limits``, closed at the end."""
    pool = Http1Pool(connect_timeout_s=5.0, idle_s=4.0, limits=limits)
    try:
        yield pool
    finally:
        await pool.close()


def once(*pieces: bytes, then_wait: bool = True) -> object:
    """A handler that reads one request, writes ``pieces`` (each flushed), then waits for
    the client to leave."""

    async def handler(server: RawServer, conn: Conn) -> None:
        await conn.read_request()
        await conn.send(*pieces)
        if then_wait:
            await conn.wait_eof()

    return handler


async def flood(conn: Conn, block: bytes, limit: int = 256 * 1024 * 1024) -> int:
    """Write ``block`` until the client leaves (or ``limit`` bytes); the bytes written."""
    sent = 0
    with contextlib.suppress(ConnectionError):
        while sent < limit:
            conn.writer.write(block)
            await conn.writer.drain()
            sent += len(block)
    return sent


async def refused_code(pool: Http1Pool, url: str) -> str:
    """The code of the ``UpstreamProtocolError`` that posting to ``url`` (and reading the
    answer) raises."""
    with pytest.raises(UpstreamProtocolError) as raised:
        await asyncio.wait_for(post_and_read(pool, url), MARGIN_S)
    return raised.value.code


async def read_or_refused(answer: bytes, *, refused: bool) -> None:
    """An engine answers ``answer`` once: the capped pool refuses its head
    (``upstream_head_too_large``), or reads it as a 200 ``{}``."""
    async with raw_server(once(answer)) as server, capped_pool() as pool:
        if refused:
            assert await refused_code(pool, server.url) == "upstream_head_too_large"
        else:
            assert await post_and_read(pool, server.url) == (200, b"{}")


# ---------------------------------------------------------------------------------- the head


async def test_header_value_that_never_ends_is_refused_at_the_cap_in_little_cpu() -> None:
    """A header value that keeps coming (httptools would join it quadratically: 32 MiB cost
    seconds of CPU) is refused once the head passes the cap, the connection closed."""
    sent: list[int] = []

    async def handler(server: RawServer, conn: Conn) -> None:
        await conn.read_request()
        conn.writer.write(b"HTTP/1.1 200 OK\r\nX-Huge: ")
        sent.append(await flood(conn, b"a" * 4096, 32 * 1024 * 1024))

    async with raw_server(handler) as server, capped_pool() as pool:
        cpu = time.process_time()
        assert await refused_code(pool, server.url) == "upstream_head_too_large"
        assert time.process_time() - cpu < 0.5
        await wait_for_state(lambda: bool(sent))
    assert sent[0] < 16 * 1024 * 1024  # the connection closed: the engine was stopped


@pytest.mark.parametrize(("spare", "refused"), [(0, False), (-1, True)])
async def test_head_exactly_at_the_cap_passes_and_one_byte_over_does_not(
    spare: int, refused: bool
) -> None:
    """A head of exactly ``head_bytes`` (its body in the same write) is read; one byte
    more is refused: only head bytes count, not the body that follows them."""
    head = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nX-Pad: "
    pad = HEADER_BYTES - len(head) - 4 + (-spare if refused else 0)
    answer = head + b"p" * pad + b"\r\n\r\n" + b"{}"
    await read_or_refused(answer, refused=refused)


@pytest.mark.parametrize(("fields", "refused"), [(8, False), (9, True)])
async def test_header_fields_over_the_cap_are_refused(fields: int, refused: bool) -> None:
    """``headers`` fields are read; one more is refused (``upstream_head_too_large``)."""
    extra = b"".join(b"X-F%d: v\r\n" % i for i in range(fields - 1))
    answer = b"HTTP/1.1 200 OK\r\n" + extra + b"Content-Length: 2\r\n\r\n{}"
    await read_or_refused(answer, refused=refused)


@pytest.mark.parametrize(("interim", "refused"), [(8, False), (9, True)])
async def test_interim_answers_over_the_cap_are_refused(interim: int, refused: bool) -> None:
    """Eight ``100 Continue`` answers before the real one are skipped; a ninth is refused."""
    answer = b"HTTP/1.1 100 Continue\r\n\r\n" * interim + OK
    await read_or_refused(answer, refused=refused)


async def test_switching_protocols_is_a_protocol_error_not_a_transport_crash() -> None:
    """A ``101`` (httptools raises ``HttpParserUpgrade``, which is not an
    ``HttpParserError``) is an ``upstream_protocol_error``: the loop reports no
    exception, the connection closes, and ``Upstream.post`` answers 502 with that code."""
    upgrade = b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n\r\n\x81\x05hello"
    errors: list[dict[str, object]] = []
    asyncio.get_running_loop().set_exception_handler(lambda _, context: errors.append(context))
    async with raw_server(once(upgrade)) as server:
        async with capped_pool() as pool:
            assert await refused_code(pool, server.url) == "upstream_protocol_error"
        upstream = Upstream(connect_timeout_s=5.0)
        await upstream.start()
        try:
            with pytest.raises(GatewayError) as raised:
                await upstream.post(server.url, BODY, "r1")
        finally:
            await upstream.close()
    assert (raised.value.status, raised.value.code) == (502, "upstream_protocol_error")
    assert errors == []
    assert server.client_left == 2


async def test_trailers_that_never_end_are_refused() -> None:
    """After the last chunk, trailer bytes with no body between them count against the head
    cap: an endless trailer is refused, not buffered."""

    async def handler(server: RawServer, conn: Conn) -> None:
        await conn.read_request()
        conn.writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n")
        conn.writer.write(b"0\r\nX-Trailer: ")
        await flood(conn, b"t" * 4096, 16 * 1024 * 1024)
        await conn.wait_eof()

    async with raw_server(handler) as server, capped_pool() as pool:
        assert await refused_code(pool, server.url) == "upstream_head_too_large"


# ---------------------------------------------------------------------------------- the body


async def test_declared_length_over_the_body_cap_is_refused_at_once() -> None:
    """A ``Content-Length`` over the cap is refused as soon as the body is to be read,
    without waiting for any of it."""
    head = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % (LIMITS.body_bytes + 1)
    async with raw_server(once(head)) as server, capped_pool() as pool:
        response = await pool.post(server.url, HEAD, BODY, reuse=True)
        response.limit_body(LIMITS.body_bytes)
        with pytest.raises(UpstreamProtocolError) as raised:
            await asyncio.wait_for(response.read(), 0.3)
        response.release()
        assert raised.value.code == "upstream_body_too_large"
        await wait_for_state(lambda: server.client_left == 1)


@pytest.mark.parametrize("chunked", [True, False], ids=["chunked", "to-eof"])
async def test_body_over_the_cap_is_refused_as_it_arrives(chunked: bool) -> None:
    """An endless body (chunked, or without a length) is refused once the bytes received
    pass the cap; the connection closes, so the engine stops being read."""
    sent: list[int] = []
    block = b"x" * 4096
    framed = b"%x\r\n%s\r\n" % (len(block), block) if chunked else block
    encoding = b"Transfer-Encoding: chunked\r\n" if chunked else b""

    async def handler(server: RawServer, conn: Conn) -> None:
        await conn.read_request()
        await conn.send(b"HTTP/1.1 200 OK\r\n" + encoding + b"\r\n")
        await asyncio.sleep(0.1)  # the cap is set before the body comes
        sent.append(await flood(conn, framed))

    async with raw_server(handler) as server, capped_pool() as pool:
        response = await pool.post(server.url, HEAD, BODY, reuse=True)
        response.limit_body(LIMITS.body_bytes)
        with pytest.raises(UpstreamProtocolError) as raised:
            await asyncio.wait_for(response.read(), MARGIN_S)
        response.release()
        assert raised.value.code == "upstream_body_too_large"
        await wait_for_state(lambda: bool(sent))
    assert sent[0] < 64 * 1024 * 1024  # the engine was stopped, far below its 256 MiB


async def test_body_exactly_at_the_cap_is_read() -> None:
    """A body of exactly ``body_bytes`` is read whole."""
    size = LIMITS.body_bytes
    answer = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % size + b"x" * size
    async with raw_server(answering(answer)) as server, capped_pool() as pool:
        response = await pool.post(server.url, HEAD, BODY, reuse=True)
        response.limit_body(size)
        assert len(await asyncio.wait_for(response.read(), MARGIN_S)) == size
        response.release()


# ---------------------------------------------------------------------------------- pooling


async def test_bytes_on_an_idle_pooled_connection_close_it() -> None:
    """Bytes that arrive on a pooled connection while no request is out close it and drop
    it from the pool: the next request opens a new connection and gets its own answer."""

    async def handler(server: RawServer, conn: Conn) -> None:
        await conn.read_request()
        await conn.send(OK)
        await asyncio.sleep(0.05)
        await conn.send(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nstray")
        await conn.wait_eof()
        while await conn.read_request() is not None:
            await conn.send(OK)

    async with raw_server(handler) as server, capped_pool() as pool:
        assert await post_and_read(pool, server.url) == (200, b"{}")
        await wait_for_state(lambda: server.client_left == 1)
        assert await post_and_read(pool, server.url) == (200, b"{}")
        assert server.accepted == 2


SENT_ID = f"0000abcd{7:024x}"
"""A request id of the gateway's shape: the process's 8-hex prefix, then a counter."""


@pytest.mark.parametrize(
    ("echoed", "refused"),
    [
        (SENT_ID, False),  # its own request's answer
        (f"0000abcd{6:024x}", True),  # another request's of this process
        ("3f0c1a52-7f4e-4c1e-9d3b-2b8f3c1a9e77", False),  # a proxy's own id: not a stray
    ],
)
async def test_an_answer_echoing_another_request_id_is_refused(echoed: str, refused: bool) -> None:
    """An engine that echoes ``X-Request-Id`` (vLLM's ``--enable-request-id-headers``) says
    whose answer it sends: its own request's is read, another request's of this process is
    refused (``upstream_protocol_error``) and its connection closed, and an id of another
    shape (a proxy in between that writes its own) is not taken for a stray answer."""
    answer = b"HTTP/1.1 200 OK\r\nX-Request-Id: %s\r\nContent-Length: 2\r\n\r\n{}" % (
        echoed.encode()
    )
    async with raw_server(once(answer)) as server, capped_pool() as pool:
        if refused:
            with pytest.raises(UpstreamProtocolError) as raised:
                await pool.post(server.url, HEAD, BODY, reuse=True, request_id=SENT_ID)
            assert raised.value.code == "upstream_protocol_error"
            await wait_for_state(lambda: server.client_left == 1)
        else:
            response = await pool.post(server.url, HEAD, BODY, reuse=True, request_id=SENT_ID)
            assert await response.read() == b"{}"
            response.release()


# ---------------------------------------------------------------------------------- uvloop


async def _body_over_the_cap_chunked() -> None:
    await test_body_over_the_cap_is_refused_as_it_arrives(chunked=True)


async def _switching_protocols() -> None:
    await test_switching_protocols_is_a_protocol_error_not_a_transport_crash()


UVLOOP_BEHAVIOURS: list[Callable[[], Coroutine[Any, Any, None]]] = [
    test_header_value_that_never_ends_is_refused_at_the_cap_in_little_cpu,
    test_trailers_that_never_end_are_refused,
    test_declared_length_over_the_body_cap_is_refused_at_once,
    test_bytes_on_an_idle_pooled_connection_close_it,
    _body_over_the_cap_chunked,
    _switching_protocols,
]


@pytest.mark.parametrize("behaviour", UVLOOP_BEHAVIOURS, ids=lambda test: test.__name__)
def test_limits_on_uvloop(behaviour: Callable[[], Coroutine[Any, Any, None]]) -> None:
    """The same caps on uvloop, the gateway's loop."""
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(behaviour())
