"""Reading a request body under a size cap: 413 before reading when Content-Length says so."""

from __future__ import annotations

from starlette.requests import Request

from sluicegate.gateway.errors import GatewayError


def _too_large(cap: int) -> GatewayError:
    return GatewayError(413, "request_too_large", f"request body exceeds {cap} bytes")


async def read_body(request: Request, cap: int) -> bytes:
    """The whole body, or ``GatewayError(413)`` as soon as it is known to exceed ``cap``."""
    declared = request.headers.get("content-length")
    if declared is not None:
        if not declared.isdigit():
            raise GatewayError(400, "invalid_content_length", "Content-Length is not a number")
        if int(declared) > cap:
            raise _too_large(cap)
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > cap:
            raise _too_large(cap)
        chunks.append(chunk)
    return b"".join(chunks)
