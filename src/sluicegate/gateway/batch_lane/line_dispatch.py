"""Running one batch line through the gateway's own inference path, in-process.

A line becomes an ASGI request handed straight to the endpoint's
``InferenceHandler``: it is classified, rate-limited, queued, admitted, routed,
preempted and accounted exactly as an HTTP request of its tenant would be,
without a socket. ``LineCall.stop`` is the client leaving: the handler ends the
ticket and the engine stops generating.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass

from starlette.types import ASGIApp, Message

from sluicegate.gateway.edge_protocol import DISCONNECT_EXTENSION
from sluicegate.gateway.request.asgi_send import PREEMPTED_HEADER
from sluicegate.gateway.request.handlers import BATCH_TENANT


@dataclass(frozen=True, slots=True)
class LineAnswer:
    """What the gateway answered a line: status, headers that matter, and the body."""

    status: int
    body: bytes
    request_id: str
    preempted: bool
    retry_after_s: float | None


class LineCall:
    """One in-process request for a batch line; ``run`` once, ``stop`` at any time."""

    def __init__(
        self, path: str, body: bytes, tenant: str, lane: str, priority: int, request_id: str
    ) -> None:
        self._body: bytes | None = body
        self._stopped = False
        self._on_stop: Callable[[], None] | None = None
        self._gone = asyncio.Event()
        self._status = 0
        self._headers: dict[bytes, bytes] = {}
        self._chunks: list[bytes] = []
        self.request_id = request_id
        self.scope = {
            "type": "http",
            "asgi": {"version": "3.0", "spec_version": "2.3"},
            "http_version": "1.1",
            "method": "POST",
            "scheme": "http",
            "path": path,
            "raw_path": path.encode(),
            "root_path": "",
            "query_string": b"",
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                (b"x-sluicegate-lane", lane.encode()),
                (b"x-sluicegate-priority", str(priority).encode()),
            ],
            "client": None,
            "server": None,
            "extensions": {DISCONNECT_EXTENSION: self._register},
            BATCH_TENANT: tenant,
        }

    def _register(self, callback: Callable[[], None] | None) -> None:
        if callback is not None and self._stopped:
            callback()
            return
        self._on_stop = callback

    def stop(self) -> None:
        """The line's client leaves: a waiting ticket leaves its queue, a running one ends."""
        if self._stopped:
            return
        self._stopped = True
        self._gone.set()
        if self._on_stop is not None:
            self._on_stop()

    async def _receive(self) -> Message:
        if self._body is not None:
            body, self._body = self._body, None
            return {"type": "http.request", "body": body, "more_body": False}
        await self._gone.wait()
        return {"type": "http.disconnect"}

    async def _send(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            self._status = message["status"]
            self._headers = dict(message.get("headers", []))
        elif message["type"] == "http.response.body":
            self._chunks.append(message.get("body", b""))

    async def run(self, app: ASGIApp) -> LineAnswer | None:
        """Serve the line with ``app`` (an inference handler); its answer, or None if it was
        stopped before one came."""
        await app(self.scope, self._receive, self._send)
        if self._stopped or self._status == 0:
            return None
        retry_ms = self._headers.get(b"retry-after-ms")
        return LineAnswer(
            status=self._status,
            body=b"".join(self._chunks),
            request_id=self.request_id,
            preempted=self._headers.get(PREEMPTED_HEADER[0]) == PREEMPTED_HEADER[1],
            retry_after_s=None if retry_ms is None else float(retry_ms) / 1000.0,
        )
