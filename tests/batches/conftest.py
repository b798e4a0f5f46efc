"""Fixtures of the batch backend tests: each backend, opened on a fresh database."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import orjson
import pytest

from sluicegate.batches.batch_backend import BatchBackend, Claim, NewBatch, NewFile, Record, Result
from sluicegate.batches.lines import LineError, LineRequest, read_line
from sluicegate.batches.objects import new_id
from sluicegate.batches.redis.redis_batches import RedisBatches
from sluicegate.batches.sqlite.sqlite_batches import SqliteBatches
from tests.store.conftest import redis_server
from tests.store.redis_server import RedisServer

__all__ = ["redis_server"]  # the store tests' module-scoped redis-server fixture, shared

BACKENDS = ("sqlite", "redis")


def make_backend(
    kind: str,
    tmp_path: Path,
    request: pytest.FixtureRequest,
    file_retention_s: int | None = None,
) -> BatchBackend:
    """A new, unopened backend of ``kind`` with nothing in it (a new file, or a new key
    prefix), whose output files expire ``file_retention_s`` after they are written."""
    if kind == "sqlite":
        return SqliteBatches(str(tmp_path / f"{new_id('b')}.db"), file_retention_s=file_retention_s)
    server: RedisServer = request.getfixturevalue("redis_server")
    return RedisBatches(server.url, prefix=new_id("test"), file_retention_s=file_retention_s)


@pytest.fixture(params=BACKENDS)
async def backend(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[BatchBackend]:
    """Each backend in turn, open and empty."""
    store = make_backend(request.param, tmp_path, request)
    await store.open()
    try:
        yield store
    finally:
        await store.close()


RETENTION_S = 1000
"""The output-file retention of the ``retained`` backends."""


@pytest.fixture(params=BACKENDS)
async def retained(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[BatchBackend]:
    """Each backend in turn, open and empty, its output files kept ``RETENTION_S``."""
    store = make_backend(request.param, tmp_path, request, RETENTION_S)
    await store.open()
    try:
        yield store
    finally:
        await store.close()


NOW = 1_700_000_000
"""The wall-clock time the tests start at (they advance it themselves)."""
LEASE_S = 30.0
ENDPOINT = "/v1/chat/completions"
MODELS = ("m1", "m2")


def read(endpoint: str, lane: str, text: bytes) -> LineRequest | LineError:
    """The ``LineReader`` of the tests: ``read_line`` knowing the models ``m1`` and ``m2``."""

    def problem(model: str) -> str | None:
        return None if model in MODELS else f"model {model!r} does not exist"

    return read_line(text, endpoint, problem, 4096)


def line(custom_id: str, model: str = "m1") -> bytes:
    """One well-formed input line."""
    body = {"model": model, "messages": [{"role": "user", "content": custom_id}]}
    return orjson.dumps({"custom_id": custom_id, "method": "POST", "url": ENDPOINT, "body": body})


def file_of(
    tenant: str,
    filename: str,
    size: int,
    now: int = NOW,
    *,
    purpose: str = "batch",
    expires_at: int | None = None,
) -> NewFile:
    """A file of ``tenant``'s to store (``purpose`` batch unless told)."""
    return NewFile(
        tenant=tenant,
        purpose=purpose,
        filename=filename,
        size=size,
        now=now,
        expires_at=expires_at,
    )


def batch_over(
    file: Record,
    *,
    window_s: int = 3600,
    lane: str = "best_effort",
    metadata: dict[str, str] | None = None,
) -> NewBatch:
    """A batch of ``file``'s tenant over ``file`` for ``ENDPOINT``, asked at ``NOW``."""
    return NewBatch(
        tenant=file["tenant"],
        input_file_id=file["id"],
        endpoint=ENDPOINT,
        window=f"{window_s}s",
        window_s=window_s,
        lane=lane,
        metadata=metadata,
        now=NOW,
    )


async def new_batch(
    backend: BatchBackend, lines: list[bytes], tenant: str = "t1", window_s: int = 3600
) -> str:
    """A ``validating`` batch of these input lines; its id."""
    file = await backend.create_file(file_of(tenant, "in.jsonl", 100), lines)
    batch = await backend.create_batch(batch_over(file, window_s=window_s))
    return str(batch["id"])


async def content(backend: BatchBackend, file_id: str | None) -> list[bytes]:
    """Every line of a file, page by page."""
    assert file_id is not None
    lines: list[bytes] = []
    while page := await backend.file_page(file_id, len(lines)):
        lines += page
    return lines


def answer(claim: Claim, ok: bool = True, prompt: int = 0, completion: int = 0) -> Result:
    """A result of a claimed line whose text names the line."""
    text = orjson.dumps({"custom_id": claim.custom_id, "ok": ok})
    return Result(claim.batch_id, claim.idx, ok, text, prompt, completion)
