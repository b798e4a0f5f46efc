"""Reading a JSON request body under a size cap: 415 unless it is JSON, 413 before reading
when Content-Length says it is too large, else as soon as the bytes read do.

Header size and count, and how long headers and body may take to arrive, are
enforced below the application by the connection protocol (``protocol.py``).
"""

from __future__ import annotations

from starlette.requests import Request

from sluicegate.gateway.errors import GatewayError


def check_media_type(content_type: str | None) -> None:
    """``GatewayError(415)`` unless the body is declared JSON (or not declared at all).

    ``application/json`` and any ``application/*+json`` type are JSON, whatever
    their parameters or letter case; a request without Content-Type is read as
    JSON, as the OpenAI API does. Anything else (a form, text, XML) is refused
    before the body is read, as the engines behind the gateway would refuse it.
    """
    if content_type is None:
        return
    media = content_type.partition(";")[0].strip().lower()
    if media == "application/json" or (
        media.startswith("application/") and media.endswith("+json")
    ):
        return
    raise GatewayError(
        415,
        "unsupported_media_type",
        "the request body must be JSON (Content-Type: application/json)",
    )


def _too_large(cap: int) -> GatewayError:
    return GatewayError(413, "request_too_large", f"request body exceeds {cap} bytes")


async def read_body(request: Request, cap: int) -> bytes:
    """The whole JSON body, or a ``GatewayError`` as soon as it breaks a cap.

    415 for a non-JSON Content-Type; 413 before reading when Content-Length
    exceeds ``cap``, else as soon as the bytes read do. A client that leaves
    half-way raises Starlette's ``ClientDisconnect``.
    """
    check_media_type(request.headers.get("content-type"))
    declared = request.headers.get("content-length")
    if declared is not None:
        # uvicorn's parser already refuses a malformed Content-Length; this guards other
        # servers. isdigit() alone admits "²", and int() refuses over 4300 digits.
        if not (declared.isascii() and declared.isdigit()):
            raise GatewayError(400, "invalid_content_length", "Content-Length is not a number")
        digits = declared.lstrip("0")
        if len(digits) > len(str(cap)) or int(digits or "0") > cap:
            raise _too_large(cap)
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > cap:
            raise _too_large(cap)
        chunks.append(chunk)
    return b"".join(chunks)
