"""A misbehaving inference engine on loopback, for the upstream-fault tests.

``FaultyEngine`` is a real HTTP/1.1 server (raw asyncio, in a background
thread) that answers ``POST /v1/completions`` and ``/v1/chat/completions``
either like a healthy OpenAI-compatible engine or with one configurable fault:
a 500, a hang before or after the first byte, a malformed or truncated event
stream, a non-JSON body, an in-stream error event, or a reset connection. The
fault can be changed while it serves (an engine that recovers), and the server
can be stopped and restarted on the same port (an engine that goes away).

It counts what reached it and notices when the gateway gives up on a request it
holds open (the connection is closed), so tests can check that a fault also
frees the upstream side.
"""

from __future__ import annotations

import asyncio
import enum
import socket
import struct
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from typing import NamedTuple

import orjson


class Fault(enum.Enum):
    """How the engine answers an inference request."""

    NONE = "none"  # a short, well-formed answer (JSON, or SSE ending in [DONE])
    ERROR_500 = "error_500"  # 500 with an OpenAI-shaped error body
    RATE_LIMITED = "rate_limited"  # 429 with an OpenAI-shaped error body, no Retry-After
    HANG_BEFORE_HEADERS = "hang_before_headers"  # reads the request, never answers
    HANG_MID_ANSWER = "hang_mid_answer"  # 200, one chunk (or half a body), then silence
    TRUNCATED_STREAM = "truncated_stream"  # 200, one chunk, then EOF without [DONE]
    CUT_MID_EVENT = "cut_mid_event"  # 200, one chunk, half an event, then EOF
    MALFORMED_STREAM = "malformed_stream"  # 200, one chunk, a non-JSON data line, [DONE]
    ERROR_EVENT = "error_event"  # 200, one chunk, an OpenAI error event, [DONE] (vLLM's way)
    GARBAGE_BODY = "garbage_body"  # 200 application/json whose body is not JSON
    RESET = "reset"  # reads the request, then resets the connection (RST, no answer)


@dataclass(frozen=True, slots=True)
class Received:
    """One inference request as the engine saw it."""

    path: str
    stream: bool


class FaultyEngine:
    """A loopback engine that answers inference requests with ``fault`` (settable live).

    Counters are read from the test thread; they are plain ints updated on the
    server's loop thread.
    """

    def __init__(self, fault: Fault = Fault.NONE, *, chunks: int = 4) -> None:
        self.fault = fault
        self.chunks = chunks
        self.port = 0
        self.received: list[Received] = []
        self.abandoned = 0  # requests held open (hangs) whose connection the gateway closed
        self.open = 0  # requests being answered or held right now
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server: asyncio.Server | None = None
        self._thread: threading.Thread | None = None
        self._writers: set[asyncio.StreamWriter] = set()

    @property
    def url(self) -> str:
        """Base URL (``http://127.0.0.1:PORT``)."""
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        """Listen (on the previous port, if it ran before) and serve in a background thread."""
        assert self._thread is None, "already running"
        ready = threading.Event()
        failure: list[BaseException] = []

        def run() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop
            try:
                self._server = loop.run_until_complete(
                    asyncio.start_server(self._connection, "127.0.0.1", self.port)
                )
                self.port = int(self._server.sockets[0].getsockname()[1])
            except BaseException as exc:
                failure.append(exc)
                ready.set()
                loop.close()
                return
            ready.set()
            try:
                loop.run_forever()
            finally:
                loop.run_until_complete(self._shutdown())
                loop.close()

        self._thread = threading.Thread(target=run, name="faulty-engine", daemon=True)
        self._thread.start()
        assert ready.wait(10), "the faulty engine did not start"
        if failure:
            self._thread = None
            raise failure[0]

    def stop(self) -> None:
        """Stop listening, reset every open connection and join the thread."""
        thread, loop = self._thread, self._loop
        if thread is None or loop is None:
            return
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        self._thread = None

    async def _shutdown(self) -> None:
        """Stop listening, end every request (a held one is not counted as abandoned) and
        reset what is still connected."""
        server = self._server
        if server is not None:
            server.close()
        tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for writer in list(self._writers):
            writer.transport.abort()
        if server is not None:
            await server.wait_closed()

    def inference_count(self) -> int:
        """How many inference requests reached the engine."""
        return len(self.received)

    # ------------------------------------------------------------------ serving

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.add(writer)
        try:
            request = await read_request(reader)
            if request is None:
                return
            method, path, _, body = request
            if method != "POST" or not path.startswith("/v1/"):
                await _reply(writer, 200, b"{}", "application/json")
                return
            try:
                parsed = orjson.loads(body)
            except orjson.JSONDecodeError:
                parsed = {}
            stream = bool(isinstance(parsed, dict) and parsed.get("stream"))
            self.received.append(Received(path, stream))
            self.open += 1
            try:
                await self._answer(reader, writer, path.endswith("/chat/completions"), stream)
            finally:
                self.open -= 1
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            self._writers.discard(writer)
            writer.close()
            with suppress(ConnectionError):
                await writer.wait_closed()

    async def _answer(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        chat: bool,
        stream: bool,
    ) -> None:
        fault = self.fault
        shape = _Shape(chat)
        if fault is Fault.ERROR_500:
            error = {
                "error": {
                    "message": "engine exploded",
                    "type": "server_error",
                    "code": None,
                    "param": None,
                }
            }
            await _reply(writer, 500, orjson.dumps(error), "application/json")
        elif fault is Fault.RATE_LIMITED:
            error = {"error": {"message": "slow down", "type": "rate_limit_error", "code": None}}
            await _reply(writer, 429, orjson.dumps(error), "application/json")
        elif fault is Fault.HANG_BEFORE_HEADERS:
            await self._hold(reader)
        elif fault is Fault.RESET:
            # Linger on, zero seconds: closing sends RST instead of FIN.
            sock = writer.get_extra_info("socket")
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            writer.transport.abort()
        elif fault is Fault.GARBAGE_BODY:
            await _reply(writer, 200, b"<html>502 Bad Gateway</html>", "application/json")
        elif not stream:
            await self._answer_unary(reader, writer, shape, fault)
        else:
            await self._answer_stream(reader, writer, shape, fault)

    async def _answer_unary(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        shape: _Shape,
        fault: Fault,
    ) -> None:
        body = orjson.dumps(shape.body(["tok"] * self.chunks))
        if fault is Fault.HANG_MID_ANSWER:
            head = _head(200, "application/json", len(body))
            writer.write(head + body[: len(body) // 2])
            await writer.drain()
            await self._hold(reader)
            return
        await _reply(writer, 200, body, "application/json")

    async def _answer_stream(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        shape: _Shape,
        fault: Fault,
    ) -> None:
        writer.write(_head(200, "text/event-stream", None) + _event(shape.chunk("tok")))
        await writer.drain()
        if fault is Fault.HANG_MID_ANSWER:
            await self._hold(reader)
            return
        if fault is Fault.TRUNCATED_STREAM:
            return
        if fault is Fault.CUT_MID_EVENT:
            writer.write(_event(shape.chunk("tok"))[:40])
            await writer.drain()
            return
        if fault is Fault.MALFORMED_STREAM:
            writer.write(b'data: {"id": "cmpl-x", "choices": [{"text": "unterminated\n\n')
        elif fault is Fault.ERROR_EVENT:
            error = {
                "error": {
                    "message": "generation failed",
                    "type": "server_error",
                    "code": None,
                    "param": None,
                }
            }
            writer.write(_event(error))
        else:
            for _ in range(self.chunks - 1):
                writer.write(_event(shape.chunk("tok")))
            writer.write(_event(shape.chunk("", finish="length")))
        writer.write(b"data: [DONE]\n\n")
        await writer.drain()

    async def _hold(self, reader: asyncio.StreamReader) -> None:
        """Keep the request open until the gateway closes the connection."""
        with suppress(ConnectionError):
            while await reader.read(65536):
                pass
        self.abandoned += 1


class _Shape:
    """OpenAI completion / chat completion bodies and stream chunks."""

    def __init__(self, chat: bool) -> None:
        self.chat = chat
        self.id = ("chatcmpl-" if chat else "cmpl-") + "faulty"
        self.created = int(time.time())

    def chunk(self, text: str, finish: str | None = None) -> dict[str, object]:
        if self.chat:
            choice: dict[str, object] = {
                "index": 0,
                "delta": {"content": text},
                "finish_reason": finish,
            }
            kind = "chat.completion.chunk"
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}
            kind = "text_completion"
        return {
            "id": self.id,
            "object": kind,
            "created": self.created,
            "model": "tiny",
            "choices": [choice],
        }

    def body(self, texts: list[str]) -> dict[str, object]:
        text = "".join(texts)
        if self.chat:
            choice: dict[str, object] = {
                "index": 0,
                "finish_reason": "length",
                "message": {"role": "assistant", "content": text},
            }
            kind = "chat.completion"
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": "length"}
            kind = "text_completion"
        usage = {
            "prompt_tokens": 1,
            "completion_tokens": len(texts),
            "total_tokens": 1 + len(texts),
        }
        return {
            "id": self.id,
            "object": kind,
            "created": self.created,
            "model": "tiny",
            "choices": [choice],
            "usage": usage,
        }


def _event(payload: object) -> bytes:
    return b"data: " + orjson.dumps(payload) + b"\n\n"


def _head(status: int, content_type: str, length: int | None) -> bytes:
    lines = [f"HTTP/1.1 {status} X", f"content-type: {content_type}", "connection: close"]
    if length is not None:
        lines.append(f"content-length: {length}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


async def _reply(writer: asyncio.StreamWriter, status: int, body: bytes, content_type: str) -> None:
    writer.write(_head(status, content_type, len(body)) + body)
    await writer.drain()


class EngineRequest(NamedTuple):
    """One request as a test engine reads it: its method, path, ``X-Request-Id`` (``-``
    when absent) and body."""

    method: str
    path: str
    request_id: bytes
    body: bytes


async def read_request(reader: asyncio.StreamReader) -> EngineRequest | None:
    """The next request on a connection, or None if the peer closed first."""
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError:
        return None
    lines = head.decode("latin-1").split("\r\n")
    method, path, _ = lines[0].split(" ", 2)
    length, request_id = 0, b"-"
    for line in lines[1:]:
        name, _, value = line.partition(":")
        if name.strip().lower() == "content-length":
            length = int(value)
        elif name.strip().lower() == "x-request-id":
            request_id = value.strip().encode("latin-1")
    body = await reader.readexactly(length) if length else b""
    return EngineRequest(method, path, request_id, body)


@contextmanager
def faulty_engine(fault: Fault = Fault.NONE, *, chunks: int = 4) -> Iterator[FaultyEngine]:
    """A started :class:`FaultyEngine`, stopped on exit."""
    engine = FaultyEngine(fault, chunks=chunks)
    engine.start()
    try:
        yield engine
    finally:
        engine.stop()
