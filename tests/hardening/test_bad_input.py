"""Bad input over real sockets: every case is answered quickly with the right 4xx, in OpenAI's
error shape, and nothing reaches the engine.

Malformed HTTP framing (a CR inside a header, Content-Length with Transfer-Encoding, a bad
chunk size...) is refused by uvicorn's parser before the application runs: a plain-text
400 "Invalid HTTP request received." and a closed connection. That is the right answer for
a request that is not HTTP; those cases check it is never a 5xx or a hang, and say so.
"""

from __future__ import annotations

import asyncio
import select
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import aiohttp
import orjson
import pytest

from sluicegate.gateway.request.auth import MAX_TOKEN_CHARS
from sluicegate.gateway.request.classify import MAX_ITEMS, MAX_TOKENS_LIMIT
from tests.gateway.gateway_harness import (
    ADMIN_KEY,
    Reply,
    Stack,
    gateway_at,
    http_call,
    model_state,
    open_stream,
    openai_error,
    serve_in_thread,
    stack,
)
from tests.hardening.hardening_harness import (
    MODEL,
    RawReply,
    RecordingEngine,
    open_socket,
    raw_exchange,
    read_reply,
    request_bytes,
)

KEY_A = "sk-hardening-tenant-a"
KEY_B = "sk-hardening-tenant-b"
CAP = 4 * 1024 * 1024  # server.max_body_bytes (the default)
MAX_HEADER_BYTES = 32 * 1024  # server.max_header_bytes (the default)
MAX_HEADERS = 100  # server.max_headers (the default)
SLOW_S = 1.0  # client header and body timeouts, shortened from 10 s and 30 s
BODY = f"""    lanes:
      - {{name: interactive}}
      - {{name: batch}}
tenants:
  - {{name: a, api_key_env: KEY_A, allowed_lanes: [interactive], max_priority: 3}}
  - {{name: b, api_key_env: KEY_B}}
server: {{client_header_timeout_s: {SLOW_S}, client_body_timeout_s: {SLOW_S}}}
"""
CHAT = "/v1/chat/completions"
GOOD = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
GOOD_RAW = orjson.dumps(GOOD)
QUICK_S = 2.0  # every refusal comes well within this, even on a loaded 2-core machine
UVICORN_400 = b"Invalid HTTP request received."


@dataclass(frozen=True)
class Live:
    """A gateway in front of a recording engine, and a decoy engine no config names."""

    gateway: Stack
    engine: RecordingEngine
    decoy: RecordingEngine
    decoy_url: str

    @property
    def port(self) -> int:
        return self.gateway.gateway_port


@pytest.fixture(scope="module")
def live() -> Iterator[Live]:
    """Tenant ``a`` may use only ``interactive`` and priorities ≥ 3; ``b`` anything."""
    engine, decoy = RecordingEngine(), RecordingEngine(seed=1)
    environ = {"KEY_A": KEY_A, "KEY_B": KEY_B}
    with (
        serve_in_thread(engine) as port,
        serve_in_thread(decoy) as decoy_port,
        gateway_at([port], BODY, environ=environ, scrape=False) as gateway,
    ):
        yield Live(gateway, engine, decoy, f"http://127.0.0.1:{decoy_port}")


@contextmanager
def nothing_forwarded(live: Live) -> Iterator[None]:
    """Fail unless the block sends no inference request to either engine."""
    before = len(live.engine.inference())
    yield
    assert len(live.engine.inference()) == before, live.engine.inference()[before:]
    assert not live.decoy.seen


def timed_call(live: Live, method: str, path: str, **kwargs: object) -> tuple[Reply, float]:
    """``http_call`` to the gateway and how long it took."""
    started = time.monotonic()
    reply = http_call(live.gateway.base_url, method, path, timeout=5.0, **kwargs)  # type: ignore[arg-type]
    return reply, time.monotonic() - started


def refused(
    live: Live, status: int, code: str | None, method: str, path: str, **kwargs: object
) -> dict[str, object]:
    """Make the call; check status, OpenAI shape, code, speed and that nothing was forwarded."""
    with nothing_forwarded(live):
        reply, seconds = timed_call(live, method, path, **kwargs)
    assert reply.status == status, (reply.status, reply.body[:300])
    error = openai_error(reply)
    if code is not None:
        assert error["code"] == code, error
    assert seconds < QUICK_S, seconds
    return error


def post_chat(
    live: Live, status: int, code: str | None, raw: bytes, content_type: str = "application/json"
) -> dict[str, object]:
    """POST ``raw`` as tenant ``a``; expect a refusal (see :func:`refused`)."""
    headers = {"Content-Type": content_type}
    return refused(live, status, code, "POST", CHAT, body=raw, key=KEY_A, headers=headers)


def assert_uvicorn_refusal(reply: RawReply) -> None:
    """uvicorn's parser refused the framing: plain 400, connection closed (not our JSON)."""
    assert reply.status == 400, reply
    assert reply.body == UVICORN_400, reply
    assert reply.closes, reply
    assert reply.seconds < QUICK_S, reply


def served(live: Live, reply: Reply) -> None:
    """A positive control: 200, and the engine received it."""
    assert reply.status == 200, (reply.status, reply.body[:300])
    assert live.engine.inference(), "the engine saw nothing"


# ------------------------------------------------------------------ body size


@pytest.mark.parametrize("declared", [CAP + 1, 50 * 1024 * 1024], ids=["cap+1", "50MB-prompt"])
def test_honest_content_length_over_the_cap_is_413_before_the_body_is_sent(
    live: Live, declared: int
) -> None:
    """A Content-Length over the cap (4 MiB here; a 50 MB prompt too) is answered 413 with
    only the headers sent: nothing is read, no token is estimated, nothing is forwarded."""
    head = request_bytes(
        "POST", CHAT, [("Authorization", f"Bearer {KEY_A}"), ("Content-Type", "application/json"),
                       ("Content-Length", str(declared))], content_length=False,
    )  # fmt: skip
    with nothing_forwarded(live):
        reply = raw_exchange(live.port, head)
    assert reply.status == 413
    assert orjson.loads(reply.body)["error"]["code"] == "request_too_large"
    assert reply.seconds < QUICK_S


def test_endless_chunked_body_is_413_at_the_cap(live: Live) -> None:
    """A chunked body that never ends gets 413 once the cap is passed: the answer arrives
    while the client is still sending (it is never waited for), and nothing is forwarded."""
    chunk = b'{"pad": "' + b"x" * 65_536
    head = request_bytes(
        "POST", CHAT, [("Authorization", f"Bearer {KEY_A}"), ("Content-Type", "application/json"),
                       ("Transfer-Encoding", "chunked")], content_length=False,
    )  # fmt: skip
    sent = 0
    with nothing_forwarded(live), open_socket(live.port) as sock:
        sock.sendall(head)
        answered = False
        while sent < 8 * CAP:
            try:
                sock.sendall(b"%x\r\n%s\r\n" % (len(chunk), chunk))
            except (BrokenPipeError, ConnectionResetError):
                break
            sent += len(chunk)
            if _readable(sock):
                answered = True
                break
        reply = read_reply(sock)
    assert reply.status == 413, reply
    assert orjson.loads(reply.body)["error"]["code"] == "request_too_large"
    # Kernel buffers on loopback hold megabytes, so how much was sent says little; what
    # matters is that the answer came while the client was still sending.
    assert answered, f"no answer while the client sent {sent} bytes"


def _readable(sock: socket.socket) -> bool:
    ready, _, _ = select.select([sock], [], [], 0)
    return bool(ready)


def test_a_body_that_stops_arriving_is_408_and_closed(live: Live) -> None:
    """A body that stops half-way gets ``client_body_timeout_s`` (30 s; 1 s here), then 408
    ``body_timeout`` and a closed connection; nothing is forwarded."""
    head = request_bytes(
        "POST", CHAT, [("Authorization", f"Bearer {KEY_A}"), ("Content-Type", "application/json"),
                       ("Content-Length", "100")], content_length=False,
    )  # fmt: skip
    with nothing_forwarded(live):
        reply = raw_exchange(live.port, head + b'{"model": ')
    assert reply.status == 408
    assert orjson.loads(reply.body)["error"]["code"] == "body_timeout"
    assert reply.closes
    assert SLOW_S * 0.9 < reply.seconds < SLOW_S + QUICK_S


def test_headers_that_stop_arriving_are_408_and_closed(live: Live) -> None:
    """Headers sent slowly and never finished (slowloris) get ``client_header_timeout_s``
    (10 s; 1 s here), then 408 ``header_timeout`` and a closed connection."""
    with nothing_forwarded(live):
        reply = raw_exchange(live.port, b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nX-A: ")
    assert reply.status == 408
    assert orjson.loads(reply.body)["error"]["code"] == "header_timeout"
    assert reply.closes
    assert SLOW_S * 0.9 < reply.seconds < SLOW_S + QUICK_S


def test_client_that_hangs_up_mid_body_costs_nothing(live: Live) -> None:
    """A client that closes its side half-way through the body: nothing is forwarded and the
    gateway serves the next request (the server logs no exception for it: see the canary)."""
    head = request_bytes(
        "POST", CHAT, [("Authorization", f"Bearer {KEY_A}"), ("Content-Type", "application/json"),
                       ("Content-Length", "1000")], content_length=False,
    )  # fmt: skip
    with nothing_forwarded(live), open_socket(live.port) as sock:
        sock.sendall(head + b'{"model": "tiny"')
        sock.shutdown(socket.SHUT_WR)
        data = sock.recv(65536)  # the answer (if any) or the close, never a hang
    assert not data.startswith(b"HTTP/1.1 5"), data
    reply, _ = timed_call(live, "POST", CHAT, json=GOOD, key=KEY_A)
    served(live, reply)


# ------------------------------------------------------------------ body content


@pytest.mark.parametrize(
    "raw",
    [
        b'{"model": "tiny", "messages": [{"role": "user", "content": "hi"}',
        GOOD_RAW + b" trailing",
        GOOD_RAW + b"}",
        b"",
        b"\xef\xbb\xbf" + GOOD_RAW,
        GOOD_RAW.replace(b'"hi"', b'"h\xffi"'),
        GOOD_RAW.replace(b'"hi"', b'"\xed\xa0\x80"'),
        GOOD_RAW.replace(b'"hi"', b'"\\ud800"'),
        GOOD_RAW.replace(b'"hi"', b'"\\udc00x"'),
        b"[" * 100_000 + b"]" * 100_000,
        b'{"model": "tiny", "x": ' + b'{"a": ' * 100_000 + b"1" + b"}" * 100_000 + b"}",
        GOOD_RAW[:-1] + b', "temperature": NaN}',
        GOOD_RAW[:-1] + b', "temperature": Infinity}',
        GOOD_RAW[:-1] + b', "temperature": -Infinity}',
        GOOD_RAW[:-1] + b', "temperature": 1e999}',
    ],
    ids=[
        "truncated", "trailing-garbage", "extra-brace", "empty", "utf8-bom", "invalid-utf8",
        "utf8-encoded-surrogate", "lone-high-surrogate-escape", "lone-low-surrogate-escape",
        "nested-100k-arrays", "nested-100k-objects", "temperature-NaN", "temperature-Infinity",
        "temperature-minus-Infinity", "temperature-1e999",
    ],
)  # fmt: skip
def test_bodies_that_are_not_json_are_400_invalid_json(live: Live, raw: bytes) -> None:
    """Not JSON as RFC 8259 and orjson define it (no NaN/Infinity, no lone surrogates, no
    invalid UTF-8, nothing after the document, nesting ≤ 1024): 400 ``invalid_json``. A
    100,000-deep document is refused by the parser's depth limit, not a RecursionError."""
    post_chat(live, 400, "invalid_json", raw)


@pytest.mark.parametrize(
    "content_type",
    ["text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x",
     "application/xml", "text/json"],
)  # fmt: skip
def test_a_body_that_is_not_declared_json_is_415(live: Live, content_type: str) -> None:
    """A Content-Type other than application/json (or +json) → 415 ``unsupported_media_type``."""
    post_chat(live, 415, "unsupported_media_type", GOOD_RAW, content_type)


@pytest.mark.parametrize(
    "content_type",
    [None, "application/json; charset=utf-8", "APPLICATION/JSON", "application/vnd.api+json"],
)
def test_json_content_types_and_none_are_served(live: Live, content_type: str | None) -> None:
    """Positive control: JSON types with parameters or in any case, or no Content-Type, serve."""
    headers = {} if content_type is None else {"Content-Type": content_type}
    reply, _ = timed_call(live, "POST", CHAT, body=GOOD_RAW, key=KEY_A, headers=headers)
    served(live, reply)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("max_tokens", 1e30), ("max_tokens", -1), ("max_tokens", 0), ("max_tokens", "10"),
        ("max_tokens", True), ("max_tokens", 2.5), ("max_tokens", MAX_TOKENS_LIMIT + 1),
        ("max_tokens", [1]), ("max_completion_tokens", 1e30), ("max_completion_tokens", -1),
        ("n", 10**6), ("n", 0), ("n", "2"), ("priority", 9), ("priority", -1),
    ],
)  # fmt: skip
def test_out_of_range_numbers_are_400_naming_the_field(
    live: Live, field: str, value: object
) -> None:
    """Numbers scheduling reads are refused, never capped: 400 ``invalid_request`` with
    ``param`` naming the field (the engine gets the original body, so a capped value would
    be accounted for while a different one ran)."""
    error = post_chat(live, 400, "invalid_request", orjson.dumps({**GOOD, field: value}))
    assert error["param"] == field


def test_max_tokens_as_a_huge_integer_literal_is_400(live: Live) -> None:
    """``10**30`` written as an integer is beyond 64 bits (parsed as a float): 400."""
    raw = GOOD_RAW.replace(b'"max_tokens":2', b'"max_tokens":' + b"1" + b"0" * 30)
    assert raw != GOOD_RAW
    post_chat(live, 400, "invalid_request", raw)


@pytest.mark.parametrize("field", ["max_tokens", "max_completion_tokens", "n", "stream"])
def test_null_means_not_given(live: Live, field: str) -> None:
    """``null`` for an optional field the gateway reads means absent (the server default)."""
    raw = orjson.dumps({**GOOD, field: None})
    reply, _ = timed_call(
        live, "POST", CHAT, body=raw, key=KEY_A, headers={"Content-Type": "application/json"}
    )
    served(live, reply)


def test_100k_messages_are_refused_before_any_estimate(live: Live) -> None:
    """100,000 messages (3 MB, under the body cap) → 400 ``array_above_max_length`` naming
    ``messages``, from a count check before anything is summed."""
    raw = orjson.dumps({"model": MODEL, "messages": [{"role": "user", "content": "x"}] * 100_000})
    assert len(raw) < CAP
    post_chat(live, 400, "array_above_max_length", raw)


def _parts(count: int) -> dict[str, object]:
    return {"role": "user", "content": [{"type": "text", "text": "x"}] * count}


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        (CHAT, {"model": MODEL, "messages": [_parts(MAX_ITEMS + 1)]}, "messages[0].content"),
        (CHAT, {"model": MODEL, "messages": [_parts(2)] * (MAX_ITEMS // 2 + 1)}, "messages"),
        ("/v1/completions", {"model": MODEL, "prompt": ["x"] * (MAX_ITEMS + 1)}, "prompt"),
        ("/v1/completions", {"model": MODEL, "prompt": [[1]] * (MAX_ITEMS + 1)}, "prompt"),
        ("/v1/embeddings", {"model": MODEL, "input": ["x"] * (MAX_ITEMS + 1)}, "input"),
    ],
    ids=["parts-of-one-message", "parts-in-all", "prompt-strings", "prompt-token-lists", "input"],
)  # fmt: skip
def test_other_arrays_over_the_cap_are_refused(
    live: Live, path: str, body: dict[str, object], param: str
) -> None:
    """Content parts (per message and in all) and prompt/input entries beyond ``MAX_ITEMS``
    → 400 ``array_above_max_length`` naming the array."""
    error = refused(live, 400, "array_above_max_length", "POST", path, json=body, key=KEY_A)
    assert error["param"] == param


def test_routing_fields_in_the_body_never_redirect(live: Live) -> None:
    """``api_base``, ``base_url`` and friends in the body, and forwarding headers, are data:
    the request goes to the configured engine, at its own address, and the decoy those
    fields name sees nothing."""
    before = len(live.engine.inference())
    fields = {
        "api_base": live.decoy_url, "base_url": live.decoy_url, "url": live.decoy_url,
        "backend": live.decoy_url, "api_key": "sk-decoy", "organization": "decoy",
        "extra_body": {"base_url": live.decoy_url},
    }  # fmt: skip
    headers = {
        "X-Forwarded-Host": live.decoy_url.removeprefix("http://"),
        "Forwarded": f"host={live.decoy_url.removeprefix('http://')}",
        "X-Original-URL": "/admin/state",
    }
    reply, _ = timed_call(live, "POST", CHAT, json={**GOOD, **fields}, key=KEY_A, headers=headers)
    served(live, reply)
    seen = live.engine.inference()[before:]
    assert [s.path for s in seen] == [CHAT]
    engine_host = live.gateway.engine_url().removeprefix("http://")
    assert seen[0].headers["host"] == engine_host
    assert "x-forwarded-host" not in seen[0].headers
    assert not live.decoy.seen


def test_absolute_form_uri_naming_another_host_goes_to_the_configured_engine(
    live: Live,
) -> None:
    """``POST http://decoy/v1/chat/completions`` is served like its path: authenticated, and
    forwarded only to the configured engine."""
    decoy = live.decoy_url.removeprefix("http://")
    data = request_bytes(
        "POST", f"http://{decoy}{CHAT}",
        [("Authorization", f"Bearer {KEY_A}"), ("Content-Type", "application/json")], GOOD_RAW,
    )  # fmt: skip
    before = len(live.engine.inference())
    reply = raw_exchange(live.port, data)
    assert reply.status == 200, reply
    assert len(live.engine.inference()) == before + 1
    assert not live.decoy.seen
    no_key = request_bytes("POST", f"http://{decoy}{CHAT}", [], GOOD_RAW)
    with nothing_forwarded(live):
        assert raw_exchange(live.port, no_key).status == 401


# ------------------------------------------------------------------ HTTP framing (uvicorn)


def _framed(*extra: tuple[str, str], body: bytes = GOOD_RAW, cl: bool = True) -> bytes:
    headers = [("Authorization", f"Bearer {KEY_A}"), ("Content-Type", "application/json")]
    return request_bytes("POST", CHAT, [*headers, *extra], body, content_length=cl)


@pytest.mark.parametrize(
    "data",
    [
        _framed(("X-Evil", "a\rInjected: 1")),
        _framed(("X-Evil", "a\x00b")),
        _framed(("X-Sluicegate-Lane", "batch\nX-Injected: 1")),
        _framed(("Transfer-Encoding", "chunked")),
        _framed(("Content-Length", "5")),
        _framed(("Content-Length", "1x"), cl=False),
        _framed(("Content-Length", "9" * 30), cl=False),
        _framed(("Transfer-Encoding", "chunked"), body=b"zz\r\n" + GOOD_RAW, cl=False),
        _framed(("Transfer-Encoding", "gzip"), cl=False),
        b"POST /v1/chat/completions HTTP/9.9\r\nHost: x\r\n\r\n",
        b"POST /v1/chat completions HTTP/1.1\r\nHost: x\r\n\r\n",
        b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + bytes(100),
    ],
    ids=[
        "CR-in-header-value", "NUL-in-header-value", "LF-in-header-value",
        "content-length-and-transfer-encoding", "two-content-lengths", "content-length-letters",
        "content-length-30-digits", "bad-chunk-size", "transfer-encoding-gzip", "http-9.9",
        "space-in-target", "tls-client-hello",
    ],
)  # fmt: skip
def test_malformed_framing_is_refused_by_the_http_parser(live: Live, data: bytes) -> None:
    """Not well-formed HTTP/1.1: uvicorn's parser answers a plain 400 and closes the
    connection before the application runs. Acceptable for broken framing; what matters is
    no 5xx, no hang, no smuggled second request, and nothing forwarded."""
    with nothing_forwarded(live):
        reply = raw_exchange(live.port, data)
    assert_uvicorn_refusal(reply)


# ------------------------------------------------------------------ headers


@pytest.mark.parametrize(
    ("method", "target"), [("POST", CHAT), ("GET", "/healthz"), ("GET", "/admin/state")]
)
@pytest.mark.parametrize(
    "extra",
    [
        [("X-Big", "a" * (64 * 1024))],
        [(f"X-Header-{i}", "v") for i in range(1000)],
        [(f"X-Header-{i}", "v" * 400) for i in range(MAX_HEADERS - 10)],
        [("Authorization", "Bearer " + "k" * 100_000)],
    ],
    ids=["64KB-of-headers", "1000-headers", "90-headers-of-400-bytes", "100KB-bearer-token"],
)
def test_oversized_headers_are_431_and_closed(
    live: Live, extra: list[tuple[str, str]], method: str, target: str
) -> None:
    """Headers over ``server.max_header_bytes`` (32 KiB) or ``max_headers`` (100), on any
    route, authenticated or not → 431 ``headers_too_large`` from the connection protocol,
    before the application runs, and the connection is closed."""
    assert sum(len(n) + len(v) for n, v in extra) > MAX_HEADER_BYTES or len(extra) > MAX_HEADERS
    headers = [("Authorization", f"Bearer {KEY_A}"), *extra]
    with nothing_forwarded(live):
        reply = raw_exchange(live.port, request_bytes(method, target, headers, GOOD_RAW))
    assert reply.status == 431, reply
    assert orjson.loads(reply.body)["error"]["code"] == "headers_too_large"
    assert reply.closes
    assert reply.seconds < QUICK_S


def test_headers_just_under_the_caps_are_served(live: Live) -> None:
    """Positive control: 90 headers and ~28 KiB in all pass (the caps are not too tight)."""
    extra = [(f"X-Header-{i}", "v" * 300) for i in range(MAX_HEADERS - 10)]
    before = len(live.engine.inference())
    reply = raw_exchange(live.port, _framed(*extra))
    assert reply.status == 200, reply
    assert len(live.engine.inference()) == before + 1


ADMIN = f"Bearer {ADMIN_KEY}"


@pytest.mark.parametrize(
    "pair",
    [(ADMIN, "Bearer sk-nobody"), ("Bearer sk-nobody", ADMIN), (ADMIN, ADMIN)],
    ids=["admin-then-other", "other-then-admin", "admin-twice"],
)
def test_two_authorization_headers_are_refused_on_admin(live: Live, pair: tuple[str, str]) -> None:
    """Two Authorization headers are ambiguous: the admin endpoints answer 401 even when
    either or both is the admin key."""
    headers = [("Authorization", value) for value in pair]
    reply = raw_exchange(live.port, request_bytes("GET", "/admin/state", headers))
    assert reply.status == 401, reply
    assert orjson.loads(reply.body)["error"]["code"] == "invalid_admin_key"


def _two_keys(first: str, second: str) -> bytes:
    headers = [("Authorization", f"Bearer {first}"), ("Authorization", f"Bearer {second}")]
    return request_bytes("POST", CHAT, [*headers, ("Content-Type", "application/json")], GOOD_RAW)


def test_two_authorization_headers_bad_first_is_401(live: Live) -> None:
    """An unknown key followed by a good one → 401, nothing forwarded."""
    with nothing_forwarded(live):
        reply = raw_exchange(live.port, _two_keys("sk-nobody", KEY_A))
    assert reply.status == 401, reply


def test_two_authorization_headers_good_first_is_401(live: Live) -> None:
    """A good key followed by another is ambiguous too: 401, nothing forwarded."""
    with nothing_forwarded(live):
        reply = raw_exchange(live.port, _two_keys(KEY_A, "sk-nobody"))
    assert reply.status == 401, reply


# ------------------------------------------------------------------ paths and hosts


@pytest.mark.parametrize(
    ("method", "target", "status"),
    [
        ("POST", "//v1/chat/completions", 404),
        ("GET", "/v1/../admin/state", 404),
        ("GET", "/v1/%2e%2e/admin/state", 404),
        ("GET", "/admin//state", 404),
        ("GET", "/admin%2Fstate", 401),
        ("GET", "/%61dmin/state", 401),
        ("GET", "http://evil/admin/state", 401),
        ("POST", "http://evil/admin/drain", 401),
        ("GET", "/admin/state?key=" + ADMIN_KEY, 401),
    ],
)  # fmt: skip
def test_path_tricks_never_bypass_authentication(
    live: Live, method: str, target: str, status: int
) -> None:
    """Dot segments, doubled or encoded slashes, percent-encoded letters, absolute-form
    URIs and keys in the query: either no route (404) or the route's own authentication
    (401); never an admin answer, never forwarded."""
    data = request_bytes(method, target, [("Authorization", f"Bearer {KEY_A}")], GOOD_RAW)
    with nothing_forwarded(live):
        reply = raw_exchange(live.port, data)
    assert reply.status == status, reply
    assert set(orjson.loads(reply.body)) == {"error"}
    assert http_call(live.gateway.base_url, "GET", "/readyz").status == 200  # not drained


@pytest.mark.parametrize("host", ["evil/v1", "evil/admin/state", "127.0.0.1/../admin", "a b"])
def test_slash_in_host_never_bypasses_authentication(live: Live, host: str) -> None:
    """A Host header with ``/`` (or a space) changes nothing: no key → 401 from the route's
    own authentication (``invalid_api_key``, ``invalid_admin_key``), not forwarded."""
    for method, target, code in (
        ("POST", CHAT, "invalid_api_key"),
        ("GET", "/admin/state", "invalid_admin_key"),
    ):
        data = request_bytes(method, target, [], GOOD_RAW).replace(
            b"Host: 127.0.0.1", b"Host: " + host.encode()
        )
        with nothing_forwarded(live):
            reply = raw_exchange(live.port, data)
        assert reply.status == 401, reply
        assert orjson.loads(reply.body)["error"]["code"] == code, reply


# ------------------------------------------------------------------ keys


@pytest.mark.parametrize(
    "authorization",
    [
        None, "", "Bearer", "Bearer ", "Basic c2stYTpzZWNyZXQ=", KEY_A, f"Token {KEY_A}",
        "Bearer " + "k" * (MAX_TOKEN_CHARS + 1), "Bearer " + KEY_A[:-1], "Bearer " + KEY_A + "x",
        f"Bearer {ADMIN_KEY}",
    ],
    ids=[
        "missing", "empty", "scheme-only", "scheme-and-space", "basic", "bare-key", "token-scheme",
        "over-max-token-chars", "prefix-of-a-key", "key-plus-a-char", "admin-key-as-tenant",
    ],
)  # fmt: skip
def test_bad_bearer_tokens_are_401(live: Live, authorization: str | None) -> None:
    """Anything but ``Bearer <a tenant's key>`` → 401 ``invalid_api_key``, nothing forwarded;
    the admin key is not a tenant key."""
    headers = {} if authorization is None else {"Authorization": authorization}
    refused(live, 401, "invalid_api_key", "POST", CHAT, json=GOOD, headers=headers)


def _with_token_bytes(token: bytes) -> bytes:
    return request_bytes("POST", CHAT, [], GOOD_RAW).replace(
        b"Host: 127.0.0.1\r\n", b"Host: 127.0.0.1\r\nAuthorization: Bearer " + token + b"\r\n"
    )


@pytest.mark.parametrize("token", [b"\xff\xfe\x80", b"sk-\xe9\xe8"])
def test_non_ascii_token_bytes_are_401(live: Live, token: bytes) -> None:
    """Non-ASCII bytes in the token, which HTTP allows in a header value: decoded as
    Latin-1, they match no key → 401 ``invalid_api_key``, nothing forwarded."""
    with nothing_forwarded(live):
        reply = raw_exchange(live.port, _with_token_bytes(token))
    assert reply.status == 401, reply
    assert orjson.loads(reply.body)["error"]["code"] == "invalid_api_key", reply


def test_control_bytes_in_a_token_are_refused_by_the_parser(live: Live) -> None:
    """Control bytes (DEL, SOH) in the token, which HTTP forbids in a header: uvicorn's
    parser answers its own 400 before the gateway runs, nothing forwarded."""
    with nothing_forwarded(live):
        reply = raw_exchange(live.port, _with_token_bytes(b"\x7f\x01ok"))
    assert reply.status == 400, reply
    assert reply.body == UVICORN_400, reply


def test_another_tenants_key_gets_that_tenants_rights(live: Live) -> None:
    """``b``'s key may use the batch lane that ``a``'s may not (403); the admin endpoints
    take neither tenant key (401) and a refused drain drains nothing."""
    lane = {"X-Sluicegate-Lane": "batch"}
    refused(live, 403, "lane_not_allowed", "POST", CHAT, json=GOOD, key=KEY_A, headers=lane)
    reply, _ = timed_call(live, "POST", CHAT, json=GOOD, key=KEY_B, headers=lane)
    served(live, reply)
    assert reply.headers["x-sluicegate-lane"] == "batch"
    for key in (KEY_A, KEY_B):
        refused(live, 401, "invalid_admin_key", "GET", "/admin/state", key=key)
        refused(live, 401, "invalid_admin_key", "POST", "/admin/drain", key=key)
    assert http_call(live.gateway.base_url, "GET", "/readyz").json() == {"status": "ready"}


@pytest.mark.parametrize(
    ("key", "status"), [(None, 401), ("sk-nobody", 401), (KEY_A, 200), (ADMIN_KEY, 200)]
)
def test_model_list_needs_a_key_when_keys_are_configured(
    live: Live, key: str | None, status: int
) -> None:
    """``GET /v1/models`` names the configured models only to a tenant or the admin
    (as OpenAI and vLLM with ``--api-key`` do); anyone else gets 401 ``invalid_api_key``."""
    reply, _ = timed_call(live, "GET", "/v1/models", key=key)
    assert reply.status == status, reply
    if status == 401:
        assert openai_error(reply)["code"] == "invalid_api_key"
    else:
        assert [m["id"] for m in reply.json()["data"]] == [MODEL]


# ------------------------------------------------------------------ lane and priority headers


@pytest.mark.parametrize(
    ("name", "value", "status", "code"),
    [
        ("X-Sluicegate-Lane", "batch", 403, "lane_not_allowed"),
        ("X-Sluicegate-Lane", "express", 400, "invalid_lane"),
        ("X-Sluicegate-Priority", "\xb2", 400, "invalid_priority"),
        ("X-Sluicegate-Priority", "0" * 5000, 400, "invalid_priority"),
        ("X-Sluicegate-Priority", "05", 400, "invalid_priority"),
        ("X-Sluicegate-Priority", "-1", 400, "invalid_priority"),
        ("X-Sluicegate-Deadline-Ms", "nan", 400, "invalid_deadline"),
        ("X-Sluicegate-Deadline-Ms", "1e999", 400, "invalid_deadline"),
        ("X-Sluicegate-Deadline-Ms", "-5", 400, "invalid_deadline"),
    ],
    ids=[
        "lane-not-allowed", "lane-unknown", "priority-superscript-two", "priority-5000-digits",
        "priority-leading-zero", "priority-negative", "deadline-nan", "deadline-inf",
        "deadline-negative",
    ],
)  # fmt: skip
def test_bad_lane_priority_and_deadline_headers(
    live: Live, name: str, value: str, status: int, code: str
) -> None:
    """A lane the tenant may not use → 403; unknown lane, or a priority that is not one
    digit 0-5, or a deadline that is not a finite positive number → 400. ``²`` (a Latin-1
    byte that ``str.isdigit`` accepts) and 5000 digits (past ``int()``'s limit) once gave 500."""
    data = _framed((name, value))
    with nothing_forwarded(live):
        reply = raw_exchange(live.port, data)
    assert reply.status == status, reply
    assert orjson.loads(reply.body)["error"]["code"] == code


ORDER_BODY = """    max_concurrency: 1
    lanes:
      - {name: interactive, max_concurrency: 1, policy: priority, preemptible: never}
tenants:
  - {name: low, api_key_env: KEY_LOW, max_priority: 4}
  - {name: high, api_key_env: KEY_HIGH}
"""


async def _until(predicate: object, within_s: float = 5.0) -> None:
    deadline = time.monotonic() + within_s
    while not predicate():  # type: ignore[operator]
        assert time.monotonic() < deadline, "condition not reached"
        await asyncio.sleep(0.02)


async def test_a_priority_above_the_tenants_cap_is_lowered_not_obeyed() -> None:
    """Decision: a priority header more important than the tenant's ``max_priority`` is
    lowered to it (served, not refused). Seen in the order of a ``priority`` lane: ``low``
    asks for 0 but is capped at 4, so ``high`` at 2, queued later, runs first."""
    environ = {"KEY_LOW": "sk-order-low", "KEY_HIGH": "sk-order-high"}
    with stack(ORDER_BODY, environ=environ) as gateway:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=20)) as session:
            hold = await open_stream(session, gateway.base_url, key="sk-order-high")
            finished: list[str] = []

            async def one(name: str, key: str, priority: str) -> None:
                headers = {"Authorization": f"Bearer {key}", "X-Sluicegate-Priority": priority}
                body = {"model": MODEL, "prompt": name, "max_tokens": 2}
                url = gateway.base_url + "/v1/completions"
                async with session.post(url, json=body, headers=headers) as response:
                    assert response.status == 200, await response.read()
                    await response.read()
                finished.append(name)

            def queued() -> int:
                return int(model_state(gateway.base_url)["queued"])

            low = asyncio.create_task(one("low", "sk-order-low", "0"))
            await _until(lambda: queued() == 1)
            high = asyncio.create_task(one("high", "sk-order-high", "2"))
            await _until(lambda: queued() == 2)
            hold.close()
            await asyncio.gather(low, high)
    assert finished == ["high", "low"]
