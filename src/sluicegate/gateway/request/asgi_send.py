"""Writing responses straight to ASGI ``send``: the inference path skips Starlette's layers."""

from __future__ import annotations

import asyncio

from starlette.types import Scope, Send

from sluicegate.gateway.edge_protocol import ABORT_EXTENSION
from sluicegate.gateway.http_errors import GatewayError, error_body, retry_headers

Headers = list[tuple[bytes, bytes]]
JSON = (b"content-type", b"application/json")
SSE: Headers = [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")]


async def send_body(send: Send, status: int, body: bytes, headers: Headers) -> None:
    """A whole response: status, ``headers`` plus Content-Length, then ``body``."""
    headers.append((b"content-length", b"%d" % len(body)))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def send_error(send: Send, error: GatewayError) -> None:
    """``error`` in OpenAI's shape, with retry headers on 429 and 503."""
    headers: Headers = [JSON]
    extra = dict(error.headers)
    if error.retry_after_s is not None:
        extra.update(retry_headers(error.retry_after_s))
    headers.extend((name.lower().encode(), value.encode()) for name, value in extra.items())
    body = error_body(error.status, error.code, error.message, error.param)
    await send_body(send, error.status, body, headers)


async def abort_connection(scope: Scope) -> None:
    """Drop the client's connection without flushing (it stopped reading)."""
    abort = scope.get("extensions", {}).get(ABORT_EXTENSION)
    if abort is not None:
        abort()
        # Let connection_lost run, so the server sees a disconnect, not an unfinished response.
        await asyncio.sleep(0)
