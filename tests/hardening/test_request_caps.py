"""``body.check_media_type`` and ``body.read_body`` on real Starlette requests (no server):
the guards uvicorn's parser normally makes unreachable still hold under another server."""

from __future__ import annotations

import pytest
from starlette.requests import Request
from starlette.types import Message

from sluicegate.gateway.body import check_media_type, read_body
from sluicegate.gateway.errors import GatewayError


def _request(headers: dict[str, str], chunks: list[bytes]) -> Request:
    scope = {
        "type": "http", "method": "POST", "path": "/v1/completions", "query_string": b"",
        "headers": [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in headers.items()],
    }  # fmt: skip
    messages = [
        {"type": "http.request", "body": chunk, "more_body": i < len(chunks) - 1}
        for i, chunk in enumerate(chunks)
    ]

    async def receive() -> Message:
        return messages.pop(0) if messages else {"type": "http.disconnect"}

    return Request(scope, receive)


@pytest.mark.parametrize(
    "content_type",
    [None, "application/json", "application/json; charset=utf-8", "Application/JSON",
     " application/json ;x=y", "application/merge-patch+json"],
)  # fmt: skip
def test_json_media_types_pass(content_type: str | None) -> None:
    """JSON, in any case, with parameters, a ``+json`` suffix, or undeclared: accepted."""
    check_media_type(content_type)


@pytest.mark.parametrize(
    "content_type",
    ["text/plain", "application/x-www-form-urlencoded", "text/json", "json", "", "+json",
     "application/jsonx", "multipart/form-data; boundary=application/json"],
)  # fmt: skip
def test_other_media_types_are_415(content_type: str) -> None:
    """Anything else, the empty string included, is 415 ``unsupported_media_type``."""
    with pytest.raises(GatewayError) as caught:
        check_media_type(content_type)
    assert (caught.value.status, caught.value.code) == (415, "unsupported_media_type")


@pytest.mark.parametrize("declared", ["\xb2", "1\xb3", "\xb9", "1 0", "-1", "0x10"])
async def test_content_length_that_is_not_ascii_digits_is_400(declared: str) -> None:
    """``str.isdigit`` accepts "²" (a Latin-1 header byte), which ``int`` refuses: ASCII only."""
    request = _request({"content-length": declared}, [b"{}"])
    with pytest.raises(GatewayError) as caught:
        await read_body(request, 1024)
    assert (caught.value.status, caught.value.code) == (400, "invalid_content_length")


@pytest.mark.parametrize("declared", ["9" * 5000, "1025", "0" * 4000 + "2048"])
async def test_declared_length_over_the_cap_is_413_unread(declared: str) -> None:
    """Over the cap → 413 before any read (5000 digits too, past ``int()``'s limit)."""
    request = _request({"content-length": declared}, [])
    with pytest.raises(GatewayError) as caught:
        await read_body(request, 1024)
    assert caught.value.status == 413


async def test_leading_zeros_under_the_cap_are_read() -> None:
    """A Content-Length with leading zeros that is within the cap is read normally."""
    request = _request({"content-length": "0000000000000000000002"}, [b"{}"])
    assert await read_body(request, 1024) == b"{}"


async def test_undeclared_body_is_cut_at_the_cap() -> None:
    """Without Content-Length, 413 as soon as the chunks read pass the cap."""
    request = _request({}, [b"x" * 600, b"x" * 600, b"never read"])
    with pytest.raises(GatewayError) as caught:
        await read_body(request, 1024)
    assert caught.value.status == 413
