"""A streamed answer of the emulator: one request's tokens as OpenAI SSE chunks, as they
come from the engine, aborting the request if the client leaves."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import orjson
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from sluicegate.emulator.openai_wire import OpenAIShape
from sluicegate.emulator.runner import (
    ChoiceEvents,
    EngineRunner,
    Event,
    FinishReason,
    RequestStream,
    Token,
)


def _sse(payload: object) -> bytes:
    return b"data: " + orjson.dumps(payload) + b"\n\n"


async def on_disconnect(receive: Receive, callback: Callable[[], object]) -> None:
    """Wait for the client to go away (ASGI ``http.disconnect``), then call ``callback``."""
    while (await receive())["type"] != "http.disconnect":
        pass
    callback()


class EventStreamResponse(Response):
    """Streams one request's tokens as OpenAI SSE chunks; aborts it if the client leaves.

    The stream runs in ``__call__`` itself (no async generator), so its
    ``finally`` runs however it ends: finished, client gone, or task cancelled.
    """

    media_type = "text/event-stream"

    def __init__(
        self,
        runner: EngineRunner,
        streams: list[RequestStream],
        shape: OpenAIShape,
        include_usage: bool,
        keepalive_s: float | None = None,
    ) -> None:
        self.status_code = 200
        self.background = None
        self.init_headers({"cache-control": "no-cache"})
        self._runner = runner
        self._streams = streams
        self._shape = shape
        self._include_usage = include_usage
        self._keepalive_s = keepalive_s

    def _abort(self) -> None:
        for stream in self._streams:
            self._runner.abort(stream.req_id)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Send headers at once, then one ``data:`` event per token as the engine emits it."""
        watcher = asyncio.create_task(on_disconnect(receive, self._abort))
        choices = ChoiceEvents(self._streams)
        try:
            await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
            await self._send_events(send, choices)
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        except OSError:
            pass  # ASGI 2.4 servers raise on send after a disconnect; finally aborts
        finally:
            watcher.cancel()
            choices.close()
            self._abort()

    async def _next(self, send: Send, choices: ChoiceEvents) -> tuple[int, Event]:
        """The next event; while none comes, an SSE comment every ``keepalive_s``."""
        if self._keepalive_s is None:
            return await choices.next()
        waiting = asyncio.ensure_future(choices.next())
        try:
            while not (await asyncio.wait({waiting}, timeout=self._keepalive_s))[0]:
                await send({"type": "http.response.body", "body": b":\n\n", "more_body": True})
            return waiting.result()
        finally:
            waiting.cancel()

    async def _send_events(self, send: Send, choices: ChoiceEvents) -> None:
        streams, shape = self._streams, self._shape
        started: set[int] = set()
        running = len(streams)
        while True:
            index, event = await self._next(send, choices)
            if isinstance(event, Token):
                first = index not in started
                started.add(index)
                chunk = _sse(shape.chunk(event.text, first=first, index=index))
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
                continue
            if event.reason is FinishReason.ABORT:
                return  # the client left or the server is stopping: no [DONE]
            tail = _sse(shape.finish_chunk(event.reason, index))
            running -= 1
            if not running:
                if self._include_usage:
                    completion = sum(stream.completion_tokens for stream in streams)
                    tail += _sse(shape.usage_chunk(streams[0].prompt_tokens, completion))
                tail += b"data: [DONE]\n\n"
            await send({"type": "http.response.body", "body": tail, "more_body": True})
            if not running:
                return
