"""Reading an inference request: the headers it needs, in one pass over the ASGI scope's
(``RequestHead``), and its JSON body under a size cap (``read_body``: 415 unless it is
JSON, 413 before reading when Content-Length says it is too large, else as soon as the
bytes read do). Straight from the scope and ``receive``: Starlette's ``Request`` and
``Headers`` cost ~4% of the gateway's CPU per request at saturation.

Header size and count, and how long headers and body may take to arrive, are
enforced below the application by the connection protocol (``gateway/edge_protocol.py``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from starlette.requests import ClientDisconnect
from starlette.types import Receive, Scope

from sluicegate.gateway.http_errors import GatewayError

_WANTED = {
    b"authorization": "authorization",
    b"content-type": "content_type",
    b"content-length": "content_length",
    b"x-sluicegate-lane": "lane",
    b"x-sluicegate-priority": "priority",
    b"x-sluicegate-deadline-ms": "deadline_ms",
}


@dataclass(slots=True)
class RequestHead:
    """The headers the inference path reads: every ``Authorization`` value (more than
    one is refused later), and the first value of each of the others."""

    authorization: list[str] = field(default_factory=list)
    content_type: str | None = None
    content_length: str | None = None
    lane: str | None = None
    priority: str | None = None
    deadline_ms: str | None = None

    @classmethod
    def of(cls, scope: Scope) -> RequestHead:
        """The head of the request in ``scope`` (header names are lower case in ASGI)."""
        head = cls()
        for name, value in scope["headers"]:
            slot = _WANTED.get(name)
            if slot is None:
                continue
            text = value.decode("latin-1")
            if slot == "authorization":
                head.authorization.append(text)
            elif getattr(head, slot) is None:
                setattr(head, slot, text)
        return head


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


async def read_body(head: RequestHead, receive: Receive, cap: int) -> bytes:
    """The whole JSON body, or a ``GatewayError`` as soon as it breaks a cap.

    415 for a non-JSON Content-Type; 413 before reading when Content-Length
    exceeds ``cap``, else as soon as the bytes read do. A client that leaves
    half-way raises Starlette's ``ClientDisconnect``.
    """
    check_media_type(head.content_type)
    declared = head.content_length
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
    while True:
        message = await receive()
        if message["type"] != "http.request":
            raise ClientDisconnect
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > cap:
            raise _too_large(cap)
        chunks.append(chunk)
        if not message.get("more_body", False):
            return chunks[0] if len(chunks) == 1 else b"".join(chunks)
