"""A hostile inference engine on loopback, for the hostile-engine tests and measurements.

``HostileEngine`` is a real HTTP/1.1 server (raw asyncio, in a background thread) that
answers ``POST /v1/...`` either like a healthy keep-alive engine (a completion whose
text is the request's prompt, so a client can tell its own answer from another's) or
in one of the ways a broken or hostile engine can answer (``Mode``): an endless body,
an endless head, a flood of interim answers, a protocol switch, a second answer nobody
asked for, a malformed chunk, a cut, a trickled head, an endless event. The mode can be
switched while it serves. Probes (``GET /health``) are always answered 200 and
``/metrics`` 404, so the gateway keeps the backend up.

The floods write with ``drain`` (they go as fast as the gateway reads) and stop when
the gateway closes the connection, or at ``budget_bytes`` / ``budget_s``, so that a
gateway without caps can be measured without exhausting the machine.
"""

from __future__ import annotations

import asyncio
import enum
import itertools
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress

import orjson

from tests.hardening.faulty_engine import read_request

BLOCK = 64 * 1024


class Mode(enum.Enum):
    """How the engine answers an inference request."""

    HEALTHY = "healthy"  # a completion echoing the prompt, keep-alive
    ENDLESS_CHUNKED = "endless_chunked"  # 200 chunked, chunks forever
    ENDLESS_LENGTH = "endless_length"  # 200 with a 1 TB Content-Length, body forever
    ENDLESS_HEADERS = "endless_headers"  # 200, header lines forever
    HUGE_HEADER_VALUE = "huge_header_value"  # 200, one header value that never ends
    INTERIM_FLOOD = "interim_flood"  # "100 Continue" heads forever
    SWITCHING_PROTOCOLS = "switching_protocols"  # 101, then another protocol's bytes
    UNSOLICITED = "unsolicited"  # the healthy answer, then a second one nobody asked for
    BAD_CHUNK_SIZE = "bad_chunk_size"  # 200 chunked, then a chunk size that is not hex
    CLOSE_MID_BODY = "close_mid_body"  # 200 with Content-Length 1000, 100 bytes, close
    SLOW_HEAD = "slow_head"  # a head trickled a few bytes at a time, never finished
    ENDLESS_EVENT = "endless_event"  # 200 text/event-stream, one event that never ends


UNSOLICITED_TEXT = "unsolicited"
"""The text of the second, unrequested answer of ``Mode.UNSOLICITED``."""


def completion(text: str, *, request_id: str = "cmpl-hostile") -> bytes:
    """A completion body whose text is ``text``."""
    choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": "length"}
    usage = {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}
    body = {
        "id": request_id,
        "object": "text_completion",
        "created": int(time.time()),
        "model": "tiny",
        "choices": [choice],
        "usage": usage,
    }
    return orjson.dumps(body)


def answer(body: bytes, request_id: bytes, content_type: bytes = b"application/json") -> bytes:
    """A keep-alive 200 with ``body``, echoing ``request_id`` as vLLM does when started with
    ``--enable-request-id-headers``."""
    head = b"HTTP/1.1 200 OK\r\nContent-Type: %s\r\nX-Request-Id: %s\r\nContent-Length: %d\r\n\r\n"
    return head % (content_type, request_id, len(body)) + body


def stream(text: str) -> bytes:
    """An event stream whose one chunk is ``text``, with usage, ending in ``[DONE]``."""
    chunk = orjson.loads(completion(text))
    chunk["choices"][0]["finish_reason"] = None
    chunk.pop("usage")
    last = orjson.loads(completion(""))
    return b"data: %s\n\ndata: %s\n\ndata: [DONE]\n\n" % (orjson.dumps(chunk), orjson.dumps(last))


class HostileEngine:
    """A loopback engine answering inference requests in ``mode`` (settable live).

    Counters are plain ints updated on the server's thread and read from the test's.
    """

    def __init__(
        self, mode: Mode = Mode.HEALTHY, *, budget_bytes: int = 1 << 30, budget_s: float = 60.0
    ) -> None:
        self.mode = mode
        self.budget_bytes = budget_bytes
        self.budget_s = budget_s
        self.unsolicited_after_s = 0.0  # Mode.UNSOLICITED: the pause before the second answer
        self.port = 0
        self.requests = 0  # inference requests received
        self.connections = 0  # connections accepted
        self.sent = 0  # bytes of hostile answers written
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        """Base URL (``http://127.0.0.1:PORT``)."""
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        """Listen on a free loopback port and serve in a background thread."""
        ready = threading.Event()

        def run() -> None:
            loop = asyncio.new_event_loop()
            asyncio.set_event_loop(loop)
            self._loop = loop
            server = loop.run_until_complete(asyncio.start_server(self._connection, "127.0.0.1", 0))
            self.port = int(server.sockets[0].getsockname()[1])
            ready.set()
            try:
                loop.run_forever()
            finally:
                server.close()
                tasks = asyncio.all_tasks(loop)
                for task in tasks:
                    task.cancel()
                loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
                loop.close()

        self._thread = threading.Thread(target=run, name="hostile-engine", daemon=True)
        self._thread.start()
        assert ready.wait(10), "the hostile engine did not start"

    def stop(self) -> None:
        """Stop serving (every connection is dropped) and join the thread."""
        if self._thread is None or self._loop is None:
            return
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._thread = None

    # ------------------------------------------------------------------ serving

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while (request := await read_request(reader)) is not None:
                method, path, request_id, body = request
                if method != "POST" or not path.startswith("/v1/"):
                    status = b"200 OK" if path == "/health" else b"404 Not Found"
                    writer.write(b"HTTP/1.1 %s\r\nContent-Length: 2\r\n\r\n{}" % status)
                    continue
                self.requests += 1
                parsed = orjson.loads(body)
                prompt, streamed = str(parsed.get("prompt", "")), bool(parsed.get("stream"))
                if not await self._answer(writer, prompt, streamed, request_id):
                    break
                await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            pass
        finally:
            writer.close()
            with suppress(ConnectionError):
                await writer.wait_closed()

    async def _answer(
        self, writer: asyncio.StreamWriter, prompt: str, streamed: bool, request_id: bytes
    ) -> bool:
        """Answer one request; whether the connection may serve another."""
        mode = self.mode
        if mode is Mode.HEALTHY:
            if streamed:
                writer.write(answer(stream(prompt), request_id, b"text/event-stream"))
            else:
                writer.write(answer(completion(prompt), request_id))
            return True
        if mode is Mode.UNSOLICITED:
            # The second answer is the first one's duplicate: it carries the same request id.
            writer.write(answer(completion(prompt), request_id))
            if self.unsolicited_after_s:
                await writer.drain()
                await asyncio.sleep(self.unsolicited_after_s)
            writer.write(answer(completion(UNSOLICITED_TEXT), request_id))
            return True
        if mode is Mode.CLOSE_MID_BODY:
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n" + b"x" * 100)
            return False
        if mode is Mode.BAD_CHUNK_SIZE:
            head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
            writer.write(head + b"Transfer-Encoding: chunked\r\n\r\n2\r\n{}\r\nzz\r\nxx\r\n")
            await self._flood(writer, itertools.repeat(b"x" * BLOCK))
            return False
        if mode is Mode.SLOW_HEAD:
            writer.write(b"HTTP/1.1 200 OK\r\nX-Slow: ")
            await self._flood(writer, itertools.repeat(b"s" * 16), pause_s=0.005)
            return False
        start, blocks = _FLOODS[mode]
        writer.write(start)
        await self._flood(writer, blocks())
        return False

    async def _flood(
        self, writer: asyncio.StreamWriter, blocks: Iterator[bytes], pause_s: float = 0.0
    ) -> None:
        """Write ``blocks`` as fast as the reader takes them (or ``pause_s`` apart) until the
        connection closes or a budget is spent."""
        deadline = time.monotonic() + self.budget_s
        sent = 0
        with suppress(ConnectionError):
            for block in blocks:
                writer.write(block)
                await writer.drain()
                sent += len(block)
                self.sent += len(block)
                if sent >= self.budget_bytes or time.monotonic() >= deadline:
                    return
                if pause_s:
                    await asyncio.sleep(pause_s)
                if writer.transport.is_closing():
                    return


def _header_lines() -> Iterator[bytes]:
    for start in itertools.count(0, 1000):
        yield b"".join(
            b"X-Hostile-%09d: %s\r\n" % (i, b"v" * 40) for i in range(start, start + 1000)
        )


def _interim_heads() -> Iterator[bytes]:
    return itertools.repeat(b"HTTP/1.1 100 Continue\r\n\r\n" * 1000)


def _chunks() -> Iterator[bytes]:
    return itertools.repeat(b"%x\r\n%s\r\n" % (BLOCK, b"x" * BLOCK))


def _bytes() -> Iterator[bytes]:
    return itertools.repeat(b"x" * BLOCK)


_OK = b"HTTP/1.1 200 OK\r\n"
_FLOODS = {
    Mode.ENDLESS_CHUNKED: (_OK + b"Transfer-Encoding: chunked\r\n\r\n", _chunks),
    Mode.ENDLESS_LENGTH: (_OK + b"Content-Length: 1000000000000\r\n\r\n", _bytes),
    Mode.ENDLESS_HEADERS: (_OK, _header_lines),
    Mode.HUGE_HEADER_VALUE: (_OK + b"X-Huge: ", _bytes),
    Mode.INTERIM_FLOOD: (b"", _interim_heads),
    Mode.SWITCHING_PROTOCOLS: (
        b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n",
        _bytes,
    ),
    Mode.ENDLESS_EVENT: (
        _OK + b"Content-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"8\r\ndata: xx\r\n",
        _chunks,
    ),
}


@contextmanager
def hostile_engine(
    mode: Mode = Mode.HEALTHY, *, budget_bytes: int = 1 << 30, budget_s: float = 60.0
) -> Iterator[HostileEngine]:
    """A started :class:`HostileEngine`, stopped on exit."""
    engine = HostileEngine(mode, budget_bytes=budget_bytes, budget_s=budget_s)
    engine.start()
    try:
        yield engine
    finally:
        engine.stop()
