"""``Http1Response.consume``: a body handed to a callback piece by piece, on the
connection's side, with the reader woken once at the end (real servers on loopback).

The unary relay rebuilds a streamed answer this way (``relay_unary.py``): a stream of
hundreds of events costs no task switch per event.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

import pytest
import uvloop

from sluicegate.gateway.upstream.http1 import UpstreamError, UpstreamProtocolError
from tests.gateway.test_http1 import (
    BODY,
    HEAD,
    MARGIN_S,
    Conn,
    RawServer,
    aiohttp_engine,
    lockstep_stream,
    open_pool,
    raw_server,
)

PIECES = [b"data: %d\n\n" % i for i in range(5)]


async def test_each_piece_reaches_the_sink_as_it_arrives_outside_any_task() -> None:
    """The engine sends a piece only once the sink has the previous one, so each is handed
    over as it arrives; every piece after the first (which may have come with the head,
    buffered) reaches the sink from the connection's callback, with no task running: the
    reader was not woken for it. ``consume`` returns at the end."""
    got = [asyncio.Event() for _ in PIECES]
    seen: list[bytes] = []
    tasks: list[asyncio.Task[object] | None] = []

    def sink(data: bytes) -> bool:
        tasks.append(asyncio.current_task())
        seen.append(data)
        got[len(seen) - 1].set()
        return False

    async with aiohttp_engine(lockstep_stream(PIECES, got)) as port, open_pool() as pool:
        response = await pool.post(
            f"http://127.0.0.1:{port}/v1/completions", HEAD, BODY, reuse=True
        )
        await asyncio.wait_for(response.consume(sink), MARGIN_S * 5)
        response.release()
    assert seen == PIECES
    assert tasks[1:] == [None] * (len(PIECES) - 1)


async def test_a_sink_that_says_stop_ends_the_wait_and_gets_no_more() -> None:
    """A sink returning ``True`` (an error event, say) wakes the reader at once: ``consume``
    returns while the engine still streams, and the sink sees nothing after."""
    got = [asyncio.Event() for _ in PIECES]
    seen: list[bytes] = []

    def sink(data: bytes) -> bool:
        seen.append(data)
        if len(seen) < 2:
            got[len(seen) - 1].set()
        return len(seen) == 2

    async with aiohttp_engine(lockstep_stream(PIECES, got)) as port, open_pool() as pool:
        response = await pool.post(
            f"http://127.0.0.1:{port}/v1/completions", HEAD, BODY, reuse=True
        )
        await asyncio.wait_for(response.consume(sink), MARGIN_S)
        got[1].set()  # the engine goes on: what it sends now is not the sink's
        await asyncio.sleep(0.05)
        response.close()
    assert seen == PIECES[:2]


async def test_what_a_sink_raises_is_raised_by_consume() -> None:
    """An exception in the sink ends the read and is raised in the reader, as it was
    raised (not as a malformed answer from inside the HTTP parser)."""
    got = [asyncio.Event() for _ in PIECES]

    def sink(data: bytes) -> bool:
        raise ValueError("sink broke")

    async with aiohttp_engine(lockstep_stream(PIECES, got)) as port, open_pool() as pool:
        response = await pool.post(
            f"http://127.0.0.1:{port}/v1/completions", HEAD, BODY, reuse=True
        )
        with pytest.raises(ValueError, match="sink broke"):
            await asyncio.wait_for(response.consume(sink), MARGIN_S)
        response.close()


def _keep(seen: list[bytes]) -> Callable[[bytes], bool]:
    """A sink that keeps every piece in ``seen`` and never stops."""

    def sink(data: bytes) -> bool:
        seen.append(data)
        return False

    return sink


def _answering_once(answer: bytes) -> Callable[[RawServer, Conn], Awaitable[None]]:
    async def handler(server: RawServer, conn: Conn) -> None:
        await conn.read_request()
        await conn.send(answer)

    return handler


async def test_a_body_that_arrived_with_the_head_goes_to_the_sink_first() -> None:
    """Body bytes already read with the head (buffered before ``consume``) go to the sink
    first, then the rest, in order; the connection is kept for the next request."""
    answer = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n"

    async def handler(server: RawServer, conn: Conn) -> None:
        while await conn.read_request() is not None:
            await conn.send(answer)
            await asyncio.sleep(0.05)
            await conn.send(b"6\r\n world\r\n0\r\n\r\n")

    seen: list[bytes] = []
    async with raw_server(handler) as server, open_pool() as pool:
        for _ in range(2):
            response = await pool.post(server.url, HEAD, BODY, reuse=True)
            await asyncio.sleep(0.02)  # the first chunk is in, buffered
            await asyncio.wait_for(response.consume(_keep(seen)), MARGIN_S)
            response.release()
        assert server.accepted == 1
    assert b"".join(seen) == b"hello world" * 2


async def test_a_cut_body_raises_upstream_error() -> None:
    """A chunked body cut mid-chunk raises ``UpstreamError`` from ``consume``."""
    answer = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n5\r\nwo"
    async with raw_server(_answering_once(answer)) as server, open_pool() as pool:
        response = await pool.post(server.url, HEAD, BODY, reuse=True)
        with pytest.raises(UpstreamError):
            await asyncio.wait_for(response.consume(lambda d: False), MARGIN_S)
        response.release()


async def test_the_body_cap_holds_while_consuming() -> None:
    """A body over ``limit_body`` fails with ``upstream_body_too_large`` though nothing is
    buffered: the sink has the piece under the cap, never the one that went over."""

    async def handler(server: RawServer, conn: Conn) -> None:
        await conn.read_request()
        await conn.send(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n")
        await asyncio.sleep(0.05)
        await conn.send(b"6\r\n world\r\n")

    seen: list[bytes] = []
    async with raw_server(handler) as server, open_pool() as pool:
        response = await pool.post(server.url, HEAD, BODY, reuse=True)
        response.limit_body(8)
        with pytest.raises(UpstreamProtocolError) as raised:
            await asyncio.wait_for(response.consume(_keep(seen)), MARGIN_S)
        assert raised.value.code == "upstream_body_too_large"
        response.release()
    assert b"".join(seen) == b"hello"


@pytest.mark.parametrize(
    "behaviour",
    [
        test_each_piece_reaches_the_sink_as_it_arrives_outside_any_task,
        test_a_sink_that_says_stop_ends_the_wait_and_gets_no_more,
        test_the_body_cap_holds_while_consuming,
    ],
    ids=lambda test: test.__name__[5:],
)
def test_on_uvloop(behaviour: Callable[[], Coroutine[Any, Any, None]]) -> None:
    """The same on uvloop, the gateway's loop, whose protocol callbacks run their own way."""
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(behaviour())
