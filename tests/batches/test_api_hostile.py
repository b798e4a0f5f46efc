"""The Files and Batches APIs against hostile and broken input.

Oversized uploads (declared and chunked), binary garbage, a million tiny lines,
empty files, wrong purposes and content types, unknown ids, bad parameters and
keys: each is refused with the documented status and code in OpenAI's error
shape, never a 500, stores nothing, and the gateway keeps serving chat requests
after it. A gateway without ``batches:`` answers 404 ``batches_disabled``.
"""

from __future__ import annotations

import io
import random
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.batches.batch_harness import (
    CHAT,
    KEY_A,
    TENANTS,
    batch_stack,
    chat_line,
    chat_works,
    client,
    file_lines,
    jsonl,
    refusal,
    start_batch,
    upload,
    wait_batch,
)
from tests.batches.raw_http import send_until_answered
from tests.gateway.gateway_harness import Stack, http_call, openai_error, stack

MAX_FILE_BYTES = 4 * 1024 * 1024
SETTINGS = f"  max_file_bytes: {MAX_FILE_BYTES}\n"
BOUNDARY = "sluicegate-hostile-boundary"


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """One gateway with the batch lane (uploads capped at 4 MiB) for the whole module."""
    with batch_stack(tmp_path_factory.mktemp("hostile"), settings=SETTINGS) as gateway:
        yield gateway


@pytest.fixture
def sdk(live: Stack) -> Iterator[openai.OpenAI]:
    """Tenant A's SDK client; after the test, the gateway must still answer a chat request."""
    yield client(live)
    chat_works(live)


def _file_ids(sdk: openai.OpenAI) -> list[str]:
    return [f.id for f in sdk.files.list()]


def _multipart_head(length: int | None) -> bytes:
    size = (
        f"Content-Length: {length}\r\n" if length is not None else "Transfer-Encoding: chunked\r\n"
    )
    return (
        "POST /v1/files HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        f"Authorization: Bearer {KEY_A}\r\n"
        f"Content-Type: multipart/form-data; boundary={BOUNDARY}\r\n{size}\r\n"
    ).encode()


def _multipart_preamble() -> bytes:
    return (
        f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="purpose"\r\n\r\nbatch\r\n'
        f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="file"; filename="x.jsonl"\r\n'
        "Content-Type: application/jsonl\r\n\r\n"
    ).encode()


def test_a_declared_oversized_upload_is_refused_before_its_body(
    live: Stack, sdk: openai.OpenAI
) -> None:
    """Content-Length (1 GiB) above ``max_file_bytes``: 413 ``file_too_large`` answered while
    the client is still sending, long before the 256 MiB it would send; nothing stored."""
    before = _file_ids(sdk)
    declared = 1024**3
    reply, sent = send_until_answered(
        live.gateway_port,
        _multipart_head(declared),
        iter([_multipart_preamble()] + [b"x" * 65536] * 4096),
    )
    assert reply.status == 413
    assert openai_error(reply)["code"] == "file_too_large"
    assert sent < 16 * 1024 * 1024  # of 256 MiB; what loopback buffers absorb
    assert _file_ids(sdk) == before


def test_a_chunked_oversized_upload_is_cut_off(live: Stack, sdk: openai.OpenAI) -> None:
    """Chunked, without Content-Length: 413 ``file_too_large`` once the cap is passed, long
    before the 256 MiB the client would send; nothing stored."""
    before = _file_ids(sdk)

    def chunks() -> Iterator[bytes]:
        piece = b"y" * 65536
        framed = f"{len(piece):x}\r\n".encode() + piece + b"\r\n"
        preamble = _multipart_preamble()
        yield f"{len(preamble):x}\r\n".encode() + preamble + b"\r\n"
        for _ in range(4096):
            yield framed

    reply, sent = send_until_answered(live.gateway_port, _multipart_head(None), chunks())
    assert reply.status == 413
    assert openai_error(reply)["code"] == "file_too_large"
    assert sent < 32 * 1024 * 1024  # of 256 MiB; the cap plus loopback buffers
    assert _file_ids(sdk) == before


def test_an_oversized_upload_through_the_sdk(sdk: openai.OpenAI) -> None:
    """The SDK sending a file over the cap gets 413 ``file_too_large``; nothing stored."""
    before = _file_ids(sdk)
    data = jsonl([chat_line("x" * 1000)] * (MAX_FILE_BYTES // 1000 + 1))
    status, error = refusal(
        lambda: sdk.files.create(file=("big.jsonl", io.BytesIO(data)), purpose="batch")
    )
    assert (status, error["code"]) == (413, "file_too_large")
    assert _file_ids(sdk) == before


def test_a_file_of_exactly_the_cap_is_stored_and_one_byte_more_is_413(sdk: openai.OpenAI) -> None:
    """``max_file_bytes`` is inclusive: a file of exactly 4 MiB is stored whole (its size and
    content as sent); the same file with one more byte is 413 and stores nothing."""
    exact = (b"a" * 1023 + b"\n") * (MAX_FILE_BYTES // 1024)
    assert len(exact) == MAX_FILE_BYTES
    stored = sdk.files.create(file=("cap.jsonl", io.BytesIO(exact)), purpose="batch")
    assert stored.bytes == MAX_FILE_BYTES
    assert sdk.files.content(stored.id).content == exact
    before = _file_ids(sdk)
    status, error = refusal(
        lambda: sdk.files.create(file=("over.jsonl", io.BytesIO(exact + b"b")), purpose="batch")
    )
    assert (status, error["code"]) == (413, "file_too_large")
    assert _file_ids(sdk) == before
    assert sdk.files.delete(stored.id).deleted is True


def test_binary_garbage_is_not_a_batch_file(sdk: openai.OpenAI) -> None:
    """Random bytes (not UTF-8): 400 ``invalid_file``, nothing stored."""
    before = _file_ids(sdk)
    garbage = random.Random(17).randbytes(20_000)
    status, error = refusal(
        lambda: sdk.files.create(file=("junk.bin", io.BytesIO(garbage)), purpose="batch")
    )
    assert (status, error["code"]) == (400, "invalid_file")
    assert _file_ids(sdk) == before


def test_utf8_garbage_fails_its_batch_with_errors(sdk: openai.OpenAI) -> None:
    """Text that is UTF-8 but not JSONL requests is stored; a batch of it fails, listing an
    ``invalid_json_line`` error per line (with line numbers), and runs nothing."""
    rng = random.Random(3)
    text = "\n".join(
        "".join(rng.choice('abc{}[]:," 01é漢🙂') for _ in range(rng.randint(1, 40)))
        for _ in range(30)
    )
    lines = [line for line in text.split("\n") if line.strip()]
    batch = start_batch(sdk, lines)
    batch = wait_batch(sdk, batch.id)
    assert batch.status == "failed"
    assert batch.errors is not None
    assert batch.errors.data
    assert {e.code for e in batch.errors.data} <= {"invalid_json_line", "invalid_custom_id"}
    assert [e.line for e in batch.errors.data] == list(range(1, len(batch.errors.data) + 1))
    assert batch.output_file_id is None
    assert batch.error_file_id is None


def test_a_million_tiny_lines_are_refused_quickly(live: Stack, sdk: openai.OpenAI) -> None:
    """10⁶ lines (above the default ``max_lines``, 50,000): 400 ``too_many_lines`` within a
    generous bound, nothing stored, and the gateway still serves."""
    before = _file_ids(sdk)
    data = b"{}\n" * 1_000_000
    started = time.monotonic()
    status, error = refusal(
        lambda: sdk.files.create(file=("many.jsonl", io.BytesIO(data)), purpose="batch")
    )
    assert time.monotonic() - started < 60
    assert (status, error["code"]) == (400, "too_many_lines")
    assert _file_ids(sdk) == before


@pytest.mark.parametrize("data", [b"", b"\n\n  \r\n\t\n"], ids=["empty", "blank-lines"])
def test_an_empty_file_is_refused(sdk: openai.OpenAI, data: bytes) -> None:
    """An empty file, or one of blank lines only: 400 ``empty_file``, nothing stored."""
    before = _file_ids(sdk)
    status, error = refusal(
        lambda: sdk.files.create(file=("e.jsonl", io.BytesIO(data)), purpose="batch")
    )
    assert (status, error["code"], error["param"]) == (400, "empty_file", "file")
    assert _file_ids(sdk) == before


@pytest.mark.parametrize("purpose", ["fine-tune", "assistants", "batch_output", ""])
def test_a_purpose_other_than_batch_is_refused(sdk: openai.OpenAI, purpose: str) -> None:
    """Any purpose but ``batch`` (including the output files' own): 400 ``invalid_purpose``."""
    status, error = refusal(
        lambda: sdk.files.create(
            file=("x.jsonl", io.BytesIO(jsonl([chat_line("x")]))),
            purpose=purpose,  # type: ignore[arg-type]
        )
    )
    assert (status, error["code"], error["param"]) == (400, "invalid_purpose", "purpose")


@pytest.mark.parametrize(
    ("content_type", "body"),
    [
        ("application/json", b'{"purpose": "batch", "file": "x"}'),
        ("text/plain", b"hello"),
        (None, b"hello"),
        ("application/x-www-form-urlencoded", b"purpose=batch&file=x"),
    ],
)
def test_an_upload_that_is_not_multipart_is_415(
    live: Stack, sdk: openai.OpenAI, content_type: str | None, body: bytes
) -> None:
    """Not ``multipart/form-data``: 415 ``unsupported_media_type``."""
    headers = {"Content-Type": content_type} if content_type else {}
    reply = http_call(live.base_url, "POST", "/v1/files", body=body, key=KEY_A, headers=headers)
    assert reply.status == 415
    assert openai_error(reply)["code"] == "unsupported_media_type"


@pytest.mark.parametrize(
    "body",
    [
        pytest.param(b"garbage without boundaries", id="no-parts"),
        pytest.param(
            f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="file"; filename="x"\r\n'
            "\r\nunterminated".encode(),
            id="unterminated-file",
        ),
        pytest.param(
            f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="purpose"\r\n\r\nbatch\r\n'
            f"--{BOUNDARY}--\r\n".encode(),
            id="no-file-part",
        ),
    ],
)
def test_broken_multipart_is_400(live: Stack, sdk: openai.OpenAI, body: bytes) -> None:
    """Multipart that is garbage, cut off, or has no file part: a 400 in OpenAI's shape."""
    before = _file_ids(sdk)
    reply = http_call(
        live.base_url, "POST", "/v1/files", body=body, key=KEY_A,
        headers={"Content-Type": f"multipart/form-data; boundary={BOUNDARY}"},
    )  # fmt: skip
    assert reply.status == 400, reply
    assert openai_error(reply)["code"] in {"invalid_request", "invalid_purpose", "missing_file"}
    assert _file_ids(sdk) == before


UNKNOWN_IDS = ["file-000000000000000000000000", "batch_nope", "x" * 500, "ünïcødé", "..%2F.."]


@pytest.mark.parametrize("unknown", UNKNOWN_IDS)
def test_unknown_ids_are_404(sdk: openai.OpenAI, unknown: str) -> None:
    """Files, content, delete, batches and cancel of an id that does not exist: 404
    ``not_found``, and a long or non-ASCII id is not echoed back."""
    for call in (
        lambda: sdk.files.retrieve(unknown),
        lambda: sdk.files.content(unknown),
        lambda: sdk.files.delete(unknown),
        lambda: sdk.batches.retrieve(unknown),
        lambda: sdk.batches.cancel(unknown),
        lambda: sdk.batches.create(input_file_id=unknown, endpoint=CHAT, completion_window="24h"),
    ):
        status, error = refusal(call)
        assert (status, error["code"], error["type"]) == (404, "not_found", "not_found_error")
        if len(unknown) > 64:
            assert unknown not in error["message"]


@pytest.fixture(scope="module")
def input_file(live: Stack) -> str:
    """One stored input file of tenant A for the create tests."""
    return upload(client(live), [chat_line("one")]).id


@pytest.mark.parametrize(
    ("create", "code", "param"),
    [
        ({"metadata": {f"k{i}": "v" for i in range(17)}}, "invalid_metadata", "metadata"),
        ({"metadata": {"k": "v" * 513}}, "invalid_metadata", "metadata"),
        ({"metadata": {"k" * 65: "v"}}, "invalid_metadata", "metadata"),
        ({"completion_window": "tomorrow"}, "invalid_completion_window", "completion_window"),
        ({"completion_window": "0h"}, "invalid_completion_window", "completion_window"),
        ({"completion_window": "25h"}, "invalid_completion_window", "completion_window"),
        ({"completion_window": "24"}, "invalid_completion_window", "completion_window"),
        ({"endpoint": "/v1/responses"}, "invalid_endpoint", "endpoint"),
        ({"endpoint": "/v1/chat/completions/"}, "invalid_endpoint", "endpoint"),
    ],
)
def test_bad_create_parameters_are_400(
    sdk: openai.OpenAI, input_file: str, create: dict[str, Any], code: str, param: str
) -> None:
    """Metadata too large, a malformed or too long completion window, an endpoint a batch may
    not target: 400 naming the parameter; no batch is created."""
    before = [b.id for b in sdk.batches.list()]
    arguments: dict[str, Any] = {
        "input_file_id": input_file,
        "endpoint": CHAT,
        "completion_window": "24h",
        **create,
    }
    status, error = refusal(lambda: sdk.batches.create(**arguments))
    assert (status, error["code"], error["param"]) == (400, code, param)
    assert [b.id for b in sdk.batches.list()] == before


@pytest.mark.parametrize(
    ("body", "status", "code"),
    [
        (b"not json", 400, "invalid_json"),
        (b"[1, 2]", 400, "invalid_json"),
        (b'{"endpoint": "/v1/chat/completions", "completion_window": "24h"}', 400,
         "invalid_request"),
        (b'{"endpoint": "/v1/chat/completions", "completion_window": "24h", "input_file_id": 7}',
         400, "invalid_request"),
        (b'{"pad": "' + b"z" * 70_000 + b'"}', 413, "request_too_large"),
    ],
    ids=["not-json", "not-object", "no-file", "file-not-string", "huge"],
)  # fmt: skip
def test_a_broken_create_body(
    live: Stack, sdk: openai.OpenAI, body: bytes, status: int, code: str
) -> None:
    """A create body that is not a JSON object, lacks ``input_file_id`` or is over 64 KiB."""
    reply = http_call(
        live.base_url,
        "POST",
        "/v1/batches",
        body=body,
        key=KEY_A,
        headers={"Content-Type": "application/json"},
    )
    assert reply.status == status
    assert openai_error(reply)["code"] == code


def test_an_output_file_is_not_an_input_file(sdk: openai.OpenAI, input_file: str) -> None:
    """A batch of a batch's output file (purpose ``batch_output``): 400 ``invalid_file``."""
    done = wait_batch(
        sdk, sdk.batches.create(input_file_id=input_file, endpoint=CHAT, completion_window="24h").id
    )
    assert done.status == "completed"
    assert done.output_file_id is not None
    assert len(file_lines(sdk, done.output_file_id)) == 1
    status, error = refusal(
        lambda: sdk.batches.create(
            input_file_id=done.output_file_id,  # type: ignore[arg-type]
            endpoint=CHAT,
            completion_window="24h",
        )
    )
    assert (status, error["code"], error["param"]) == (400, "invalid_file", "input_file_id")


@pytest.mark.parametrize("limit", ["0", "101", "-1", "abc", "1.5", "%D9%A3", "", "1e2"])
@pytest.mark.parametrize("path", ["/v1/batches", "/v1/files"])
def test_a_limit_out_of_range_is_400(
    live: Stack, sdk: openai.OpenAI, path: str, limit: str
) -> None:
    """``limit`` not an integer in 1–100, on both lists: 400 ``invalid_limit``."""
    reply = http_call(live.base_url, "GET", f"{path}?limit={limit}", key=KEY_A)
    assert reply.status == 400
    error = openai_error(reply)
    assert (error["code"], error["param"]) == ("invalid_limit", "limit")


def test_limit_bounds_through_the_sdk(sdk: openai.OpenAI) -> None:
    """The SDK's ``limit=0`` and ``limit=101`` are refused; 1 and 100 are served."""
    for limit in (0, 101):
        status, error = refusal(lambda limit=limit: sdk.batches.list(limit=limit))
        assert (status, error["code"]) == (400, "invalid_limit")
    assert len(sdk.files.list(limit=1).data) <= 1
    assert sdk.batches.list(limit=100).object == "list"


ROUTES = [
    ("GET", "/v1/files"), ("POST", "/v1/files"), ("GET", "/v1/files/file-x"),
    ("DELETE", "/v1/files/file-x"), ("GET", "/v1/files/file-x/content"),
    ("GET", "/v1/batches"), ("POST", "/v1/batches"), ("GET", "/v1/batches/batch_x"),
    ("POST", "/v1/batches/batch_x/cancel"),
]  # fmt: skip


@pytest.mark.parametrize(("method", "path"), ROUTES)
@pytest.mark.parametrize("key", [None, "sk-wrong", ""], ids=["no-key", "bad-key", "empty-key"])
def test_no_or_a_bad_key_is_401(
    live: Stack, sdk: openai.OpenAI, method: str, path: str, key: str | None
) -> None:
    """Every Files and Batches route without a tenant key, or with a wrong one: 401
    ``invalid_api_key``."""
    reply = http_call(live.base_url, method, path, key=key, body=b"{}")
    assert reply.status == 401
    assert openai_error(reply)["code"] == "invalid_api_key"


def test_a_bad_key_through_the_sdk(live: Stack) -> None:
    """The SDK with an unknown key gets ``AuthenticationError`` on upload and list."""
    wrong = client(live, "sk-not-a-tenant")
    with pytest.raises(openai.AuthenticationError):
        wrong.files.create(file=("x.jsonl", io.BytesIO(b"{}\n")), purpose="batch")
    with pytest.raises(openai.AuthenticationError):
        wrong.batches.list()


@settings(
    max_examples=30,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(data=st.binary(max_size=3000) | st.text(max_size=1500).map(str.encode))
def test_any_upload_is_stored_as_its_lines_or_refused(live: Stack, data: bytes) -> None:
    """Any bytes as a file: either 200 with the file's non-blank lines stored exactly as sent
    (each ending in a newline), or 400 ``invalid_file``/``empty_file``; never anything else."""
    sdk = client(live)
    try:
        stored = sdk.files.create(file=("h.jsonl", io.BytesIO(data)), purpose="batch")
    except openai.APIStatusError as exc:
        refused = (exc.status_code, exc.code)
        assert refused in {(400, "invalid_file"), (400, "empty_file")}
        return
    expected = [raw.rstrip(b"\r\n") for raw in io.BytesIO(data)]
    expected = [line for line in expected if line.strip()]
    assert stored.bytes == len(data)
    assert sdk.files.content(stored.id).content == b"".join(line + b"\n" for line in expected)
    assert sdk.files.delete(stored.id).deleted is True


def test_without_batches_every_path_is_404_batches_disabled() -> None:
    """A gateway without ``batches:`` answers 404 ``batches_disabled`` on every Files and
    Batches route, and the SDK sees ``NotFoundError``; chat still works."""
    with stack(TENANTS, environ={"KEY_A": KEY_A, "KEY_B": "sk-b"}) as gateway:
        for method, path in ROUTES:
            reply = http_call(gateway.base_url, method, path, key=KEY_A, body=b"{}")
            assert reply.status == 404, (method, path)
            assert openai_error(reply)["code"] == "batches_disabled"
        status, error = refusal(
            lambda: client(gateway).files.create(
                file=("x.jsonl", io.BytesIO(b"{}\n")), purpose="batch"
            )
        )
        assert (status, error["code"]) == (404, "batches_disabled")
        chat_works(gateway)


def test_the_gateway_stays_up_after_garbage_in_path(tmp_path: Path) -> None:
    """A fresh gateway: a batch run after a string of refused uploads still completes."""
    with batch_stack(tmp_path, settings=SETTINGS) as gateway:
        sdk = client(gateway)
        for data in (b"\xff\xfe" * 100, b"", b"{}\n" * 60_000):
            with pytest.raises(openai.BadRequestError):
                sdk.files.create(file=("x", io.BytesIO(data)), purpose="batch")
        batch = wait_batch(sdk, start_batch(sdk, [chat_line("after")]).id)
        assert batch.status == "completed"
        assert [line["custom_id"] for line in file_lines(sdk, batch.output_file_id)] == ["after"]
