"""The HTTP client's ``Sink``: answers written straight to ASGI ``send``, skipping
Starlette's layers on the inference path."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from starlette.types import Receive, Scope, Send

from sluicegate.gateway.edge_protocol import ABORT_EXTENSION, DISCONNECT_EXTENSION
from sluicegate.gateway.http_errors import retry_headers
from sluicegate.gateway.request.sink import Reply

Headers = list[tuple[bytes, bytes]]
JSON = (b"content-type", b"application/json")
SSE: Headers = [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")]
PREEMPTED_HEADER = (b"x-sluicegate-preempted", b"1")


def _gateway_headers(queued_s: float, lane: str) -> Headers:
    """The gateway's own response headers: queue time and lane."""
    return [
        (b"x-sluicegate-queue-ms", b"%.1f" % (queued_s * 1000)),
        (b"x-sluicegate-lane", lane.encode()),
    ]


async def _watch_disconnect(receive: Receive, gone: Callable[[], None]) -> None:
    """Call ``gone`` on the client's ``http.disconnect``: a task per request, for servers
    without the gateway protocol's ``sluicegate.on_disconnect`` extension."""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            gone()
            return


class HttpSink:
    """An HTTP client's end of a request. ``started``: the response has begun, so an
    error can no longer be answered (the connection is cut instead)."""

    __slots__ = ("_extensions", "_receive", "_send", "_watcher", "started")

    def __init__(self, scope: Scope, receive: Receive, send: Send) -> None:
        self._extensions: dict[str, Any] = scope.get("extensions") or {}
        self._receive = receive
        self._send = send
        self._watcher: asyncio.Task[None] | None = None
        self.started = False

    def listen(self, gone: Callable[[], None] | None, /) -> None:
        """Call ``gone`` when the client disconnects: through the server's extension, or
        a task that waits for ``http.disconnect``."""
        on_disconnect = self._extensions.get(DISCONNECT_EXTENSION)
        if on_disconnect is not None:
            on_disconnect(gone)
        elif gone is not None:
            self._watcher = asyncio.create_task(_watch_disconnect(self._receive, gone))
        elif self._watcher is not None:
            self._watcher.cancel()
            self._watcher = None

    async def answer(self, reply: Reply, /) -> None:
        """The whole response: JSON (or an event stream), the gateway's headers, whether it
        was preempted, and the retry headers of an engine's 429."""
        headers: Headers = [*SSE] if reply.events else [JSON]
        headers += _gateway_headers(reply.queued_s, reply.lane)
        if reply.preempted:
            headers.append(PREEMPTED_HEADER)
        if reply.retry_after_s is not None:
            headers.extend(
                (name.lower().encode(), value.encode())
                for name, value in retry_headers(reply.retry_after_s).items()
            )
        body = reply.body
        headers.append((b"content-length", b"%d" % len(body)))
        self.started = True
        send = self._send
        await send({"type": "http.response.start", "status": reply.status, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    async def open_stream(self, queued_s: float, lane: str, /) -> None:
        """The head of a 200 event stream."""
        headers = [*SSE, *_gateway_headers(queued_s, lane)]
        self.started = True
        await self._send({"type": "http.response.start", "status": 200, "headers": headers})

    async def stream(self, data: bytes, /) -> None:
        """Events, as a chunk of the streamed body."""
        await self._send({"type": "http.response.body", "body": data, "more_body": True})

    async def end_stream(self, tail: bytes, /) -> None:
        """The last chunk of the streamed body."""
        await self._send({"type": "http.response.body", "body": tail, "more_body": False})

    async def abort(self) -> None:
        """Drop the client's connection without flushing (it stopped reading)."""
        abort = self._extensions.get(ABORT_EXTENSION)
        if abort is not None:
            abort()
            # Let connection_lost run, so the server sees a disconnect, not an unfinished
            # response.
            await asyncio.sleep(0)
