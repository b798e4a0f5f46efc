"""Quotas and expiry of ``RedisBatches``: what a tenant keeps, and when it goes.

Per tenant, ``usage:<tenant>`` holds ``bytes`` (of its files, plus uploads under way)
and ``pending`` (uploads under way); its files are ``files:<tenant>`` and its batches not
yet over ``active:<tenant>`` (by the end of their window), so a count is one ``ZCARD``.
An upload first reserves its size and one file (``reserve.lua``, atomic: two uploads at once
cannot both take the last byte); the file's creation turns the reservation into the file,
and a failed upload gives it back (``release.lua``). ``uploads`` (id → ``tenant|bytes``) and
``upload_at`` (by start) hold the reservations, so the sweeper frees those of a replica
that died. Files that expire are in ``fexp`` (and ``fexp:<tenant>``) by ``expires_at``,
batches that are over in ``ended`` by the time they ended.
"""

from __future__ import annotations

from typing import Any

import redis.asyncio as aioredis

from sluicegate.batches.batch_backend import (
    UPLOAD_TTL_S,
    NewFile,
    Quota,
    QuotaExceededError,
    Swept,
)
from sluicegate.batches.redis.batch_scripts import BatchScripts
from sluicegate.batches.redis.lifecycle import as_str


def _limit(value: int | None) -> str:
    return "" if value is None else str(value)


def refusal(reply: Any, limit: int | None) -> QuotaExceededError:
    """The ``QuotaExceededError`` of a script's ``{kind, soonest}`` refusal."""
    kind, soonest = (as_str(part) for part in reply)
    return QuotaExceededError(kind, limit or 0, float(soonest) if soonest else None)


class RedisRetention:
    """Reservations, releases and the sweep of ``RedisBatches``."""

    def __init__(self, client: aioredis.Redis, scripts: BatchScripts) -> None:
        self._redis = client
        self.base = scripts.base
        self._run = scripts.run

    async def reserve(self, file: NewFile, file_id: str, quota: Quota) -> None:
        """Hold ``file.size`` bytes and one file of the tenant's quota for the upload
        ``file_id``; ``QuotaExceededError`` if they do not fit."""
        reply = await self._run(
            "reserve", file.tenant, file_id, file.size, file.now,
            _limit(quota.max_bytes), _limit(quota.max_files),
        )  # fmt: skip
        if isinstance(reply, list):
            kind = as_str(reply[0])
            raise refusal(reply, quota.max_files if kind == "files" else quota.max_bytes)

    async def release(self, file_id: str) -> None:
        """Give back an upload's reservation and drop its lines (idempotent)."""
        await self._run("release", file_id)

    async def sweep(self, now: int, batch_retention_s: int | None, limit: int) -> Swept:
        """See ``BatchBackend.sweep``."""
        files = batches = uploads = 0
        for raw in await self._redis.zrangebyscore(
            self.base + "fexp", "-inf", now, start=0, num=limit
        ):
            files += int(await self._run("delete_file", as_str(raw), "", now))
        for raw in await self._redis.zrangebyscore(
            self.base + "upload_at", "-inf", now - UPLOAD_TTL_S, start=0, num=limit
        ):
            uploads += int(await self._run("release", as_str(raw)))
        if batch_retention_s is not None:
            due = now - batch_retention_s
            for raw in await self._redis.zrangebyscore(
                self.base + "ended", "-inf", due, start=0, num=limit
            ):
                batches += int(await self._run("purge_batch", as_str(raw), due))
        return Swept(files=files, batches=batches, uploads=uploads)
