"""What the Files and Batches APIs read from a client, each bounded by size as it arrives.

An upload's lines are read from its spooled file in blocks of ``READ_BYTES``, so a
line over ``batches.max_line_bytes`` is refused once that many bytes of it were read,
never held whole; a create's JSON body is counted as it arrives. A quota refusal is
answered as OpenAI answers quota problems: 429, with ``x-should-retry: false`` so that
the SDKs do not send a large upload again by themselves.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import IO

from starlette.datastructures import FormData
from starlette.requests import Request

from sluicegate.batches.batch_backend import QuotaExceededError
from sluicegate.batches.batches_config import BatchesSpec
from sluicegate.gateway.http_errors import GatewayError

READ_BYTES = 64 * 1024
"""What an upload's lines are read from its spooled file in."""
MIN_EXPIRES_AFTER_S = 3600
MAX_EXPIRES_AFTER_S = 2_592_000
"""``expires_after[seconds]`` of an upload: one hour to 30 days, as OpenAI takes it."""
QUOTA_FIELDS = {
    "bytes": ("bytes of files stored", "max_bytes"),
    "files": ("files stored", "max_files"),
    "active_batches": ("batches not yet over", "max_active_batches"),
}


def bounded_lines(stream: IO[bytes], max_lines: int, max_line_bytes: int) -> Iterator[bytes]:
    """The non-blank lines of an upload (without line endings), each checked to be UTF-8
    and at most ``max_line_bytes``; a ``GatewayError`` as soon as one is not, or there are
    more than ``max_lines``. Holds one block and one line at most."""
    number = count = 0
    pending = bytearray()

    def finish(raw: bytes) -> bytes | None:
        nonlocal count
        line = raw.rstrip(b"\r")
        if len(line) > max_line_bytes:
            raise _too_large(number, max_line_bytes)
        if not line.strip():
            return None
        try:
            line.decode("utf-8")
        except UnicodeDecodeError:
            raise GatewayError(
                400,
                "invalid_file",
                f"line {number} is not UTF-8 text (a batch file is JSONL)",
                param="file",
            ) from None
        count += 1
        if count > max_lines:
            raise GatewayError(
                400,
                "too_many_lines",
                f"the file has more than {max_lines} lines (batches.max_lines)",
                param="file",
            )
        return line

    while block := stream.read(READ_BYTES):
        start = 0
        while (end := block.find(b"\n", start)) != -1:
            number += 1
            if pending:
                pending += block[start:end]
                line = finish(bytes(pending))
                pending.clear()
            else:
                line = finish(block[start:end])
            if line is not None:
                yield line
            start = end + 1
        pending += block[start:]
        if len(pending) > max_line_bytes + 1:  # + 1: a "\r" before the "\n" to come
            raise _too_large(number + 1, max_line_bytes)
    if pending:
        number += 1
        line = finish(bytes(pending))
        if line is not None:
            yield line


def _too_large(number: int, limit: int) -> GatewayError:
    return GatewayError(
        400,
        "line_too_large",
        f"line {number} is over {limit} bytes (batches.max_line_bytes); nothing was stored",
        param="file",
    )


def expires_at(form: FormData, spec: BatchesSpec, now: int) -> int | None:
    """When an upload expires: ``expires_after[seconds]`` after its creation if it asks
    (``expires_after[anchor]`` must be ``created_at``), at most ``batches.file_retention``
    after it; None when neither applies."""
    anchor = form.get("expires_after[anchor]")
    seconds = form.get("expires_after[seconds]")
    retention = spec.file_retention_s
    if anchor is None and seconds is None:
        return None if retention is None else now + retention
    if anchor != "created_at":
        raise GatewayError(
            400,
            "invalid_expires_after",
            "expires_after[anchor] must be 'created_at'",
            param="expires_after.anchor",
        )
    if (
        not isinstance(seconds, str)
        or not (seconds.isascii() and seconds.isdigit())
        or not MIN_EXPIRES_AFTER_S <= int(seconds) <= MAX_EXPIRES_AFTER_S
    ):
        raise GatewayError(
            400,
            "invalid_expires_after",
            f"expires_after[seconds] must be an integer from {MIN_EXPIRES_AFTER_S} to "
            f"{MAX_EXPIRES_AFTER_S}",
            param="expires_after.seconds",
        )
    asked = int(seconds)
    return now + (asked if retention is None else min(asked, retention))


async def read_capped(request: Request, cap: int) -> bytes:
    """A request body of at most ``cap`` bytes: 413 ``request_too_large`` before reading
    when Content-Length says more, else as soon as more arrived."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > cap:
        raise GatewayError(413, "request_too_large", f"body exceeds {cap} bytes")
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > cap:
            raise GatewayError(413, "request_too_large", f"body exceeds {cap} bytes")
    return bytes(body)


def quota_refusal(exc: QuotaExceededError, spec: BatchesSpec) -> GatewayError:
    """429 ``quota_exceeded``: what is full, and when something of the tenant's ends (its
    earliest file expiry or batch window, plus a sweep) as ``Retry-After``; an hour when
    nothing of it ends by itself."""
    what, field = QUOTA_FIELDS.get(exc.kind, (exc.kind, exc.kind))
    now = time.time()
    wait = 3600.0 if exc.retry_at is None else exc.retry_at - now + spec.sweep_interval_s
    return GatewayError(
        429,
        "quota_exceeded",
        f"the tenant's quota of {exc.limit} {what} is reached (batches.quota.{field}); "
        "delete files, or wait for some to expire or batches to end",
        retry_after_s=max(1.0, wait),
        headers={"x-should-retry": "false"},
    )
