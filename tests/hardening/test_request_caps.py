"""``body.check_media_type``, ``body.RequestHead`` and ``body.read_body`` on ASGI scopes and
``receive`` callables (no server): the guards uvicorn's parser normally makes
unreachable still hold under another server."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import pytest
from starlette.requests import ClientDisconnect
from starlette.types import Message

from sluicegate.gateway.http_errors import GatewayError
from sluicegate.gateway.request.body import RequestHead, check_media_type, read_body

Receive = Callable[[], Awaitable[Message]]


def _request(headers: dict[str, str], chunks: list[bytes]) -> tuple[RequestHead, Receive]:
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

    return RequestHead.of(scope), receive


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
    head, receive = _request({"content-length": declared}, [b"{}"])
    with pytest.raises(GatewayError) as caught:
        await read_body(head, receive, 1024)
    assert (caught.value.status, caught.value.code) == (400, "invalid_content_length")


@pytest.mark.parametrize("declared", ["9" * 5000, "1025", "0" * 4000 + "2048"])
async def test_declared_length_over_the_cap_is_413_unread(declared: str) -> None:
    """Over the cap → 413 before any read (5000 digits too, past ``int()``'s limit)."""
    head, receive = _request({"content-length": declared}, [])
    with pytest.raises(GatewayError) as caught:
        await read_body(head, receive, 1024)
    assert caught.value.status == 413


async def test_leading_zeros_under_the_cap_are_read() -> None:
    """A Content-Length with leading zeros that is within the cap is read normally."""
    head, receive = _request({"content-length": "0000000000000000000002"}, [b"{}"])
    assert await read_body(head, receive, 1024) == b"{}"


async def test_undeclared_body_is_cut_at_the_cap() -> None:
    """Without Content-Length, 413 as soon as the chunks read pass the cap."""
    head, receive = _request({}, [b"x" * 600, b"x" * 600, b"never read"])
    with pytest.raises(GatewayError) as caught:
        await read_body(head, receive, 1024)
    assert caught.value.status == 413


async def test_body_in_chunks_is_joined_whole() -> None:
    """A body sent in several ``http.request`` messages is returned whole, in order."""
    head, receive = _request({"content-type": "application/json"}, [b'{"a"', b":", b"1}"])
    assert await read_body(head, receive, 1024) == b'{"a":1}'


async def test_client_that_leaves_mid_body_is_a_disconnect() -> None:
    """``http.disconnect`` before the last chunk raises ``ClientDisconnect``."""
    head, _ = _request({}, [b'{"a"'])
    messages = [{"type": "http.request", "body": b'{"a"', "more_body": True}]

    async def leaving() -> Message:
        return messages.pop(0) if messages else {"type": "http.disconnect"}

    with pytest.raises(ClientDisconnect):
        await read_body(head, leaving, 1024)


def test_head_keeps_every_authorization_and_the_first_of_the_others() -> None:
    """Every ``Authorization`` value is kept (two are refused later); of the other headers
    the first value counts, as Starlette's ``Headers.get`` gives; names are matched in
    the lower case ASGI gives them; unrelated headers are ignored."""
    scope = {
        "headers": [
            (b"authorization", b"Bearer a"),
            (b"x-sluicegate-lane", b"batch"),
            (b"x-sluicegate-lane", b"interactive"),
            (b"authorization", b"Bearer b"),
            (b"x-sluicegate-priority", b"2"),
            (b"x-sluicegate-deadline-ms", b"1500"),
            (b"content-type", b"application/json"),
            (b"content-length", b"7"),
            (b"x-other", b"\xe9"),
        ]
    }
    head = RequestHead.of(scope)
    assert head == RequestHead(
        authorization=["Bearer a", "Bearer b"],
        content_type="application/json",
        content_length="7",
        lane="batch",
        priority="2",
        deadline_ms="1500",
    )
