"""How ``RedisBatches`` reads its records back: a file's or a batch's hash (``f:<id>``,
``b:<id>``) as a ``Record`` of its columns, and a tenant's files or batches listed newest
first from their sorted set (``files:<tenant>``, ``batches:<tenant>``, scored by ``seq``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

import redis.asyncio as aioredis

from sluicegate.batches.batch_backend import Record
from sluicegate.batches.objects import STATUS_TIMES
from sluicegate.batches.redis.lifecycle import as_str

CHUNK = 1000
"""Ids read per round trip of a listing."""

FILE_COLUMNS = (
    "seq",
    "id",
    "tenant",
    "purpose",
    "filename",
    "bytes",
    "lines",
    "created_at",
    "expires_at",
)
_FILE_INTS = frozenset({"seq", "bytes", "lines", "created_at", "expires_at"})
BATCH_COLUMNS = (
    "seq",
    "id",
    "tenant",
    "endpoint",
    "input_file_id",
    "completion_window",
    "lane",
    "status",
    "metadata",
    "errors",
    "total",
    "output_file_id",
    "error_file_id",
    "created_at",
    "expires_at",
    *STATUS_TIMES,
)
_BATCH_INTS = frozenset({"seq", "total", "created_at", "expires_at", *STATUS_TIMES})


def _record(raw: dict[Any, Any], columns: tuple[str, ...], ints: frozenset[str]) -> Record:
    fields = {as_str(key): value for key, value in raw.items()}
    row: Record = {}
    for name in columns:
        value = fields.get(name)
        if value is None:
            row[name] = 0 if name == "total" else None
        else:
            row[name] = int(value) if name in ints else as_str(value)
    return row


def file_record(raw: dict[Any, Any]) -> Record:
    """A file's hash as its row of ``FILE_COLUMNS``."""
    return _record(raw, FILE_COLUMNS, _FILE_INTS)


def batch_record(raw: dict[Any, Any]) -> Record:
    """A batch's hash as its row of ``BATCH_COLUMNS`` (``total`` 0 until it is known)."""
    return _record(raw, BATCH_COLUMNS, _BATCH_INTS)


async def listing(
    redis: aioredis.Redis,
    base: str,
    index: str,
    tenant: str,
    after: str | None,
    limit: int,
    keep: Callable[[Record], bool] = lambda row: True,
) -> tuple[list[Record], bool]:
    """Rows of the tenant's ``index`` (``files:`` or ``batches:``) newest first, after
    ``after``, that ``keep``; and whether more follow."""
    kind, read = ("f:", file_record) if index == "files:" else ("b:", batch_record)
    key = f"{base}{index}{tenant}"
    top = "+inf"
    if after is not None:
        seq = await redis.zscore(key, after)
        if seq is None:
            return [], False
        top = f"({int(seq)}"
    found: list[Record] = []
    while len(found) <= limit:
        ids = await redis.zrevrangebyscore(key, top, "-inf", start=0, num=CHUNK, withscores=True)
        if not ids:
            break
        async with redis.pipeline(transaction=False) as pipe:
            for item_id, _ in cast(list[tuple[bytes, float]], ids):
                pipe.hgetall(f"{base}{kind}{as_str(item_id)}")
            raws = await pipe.execute()
        for raw in raws:
            if raw and keep(row := read(raw)):
                found.append(row)
        top = f"({int(ids[-1][1])}"
    return found[:limit], len(found) > limit
