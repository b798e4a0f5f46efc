"""Quotas and expiry of ``RedisBatches``: what a tenant keeps, and when it goes.

Per tenant, ``usage:<tenant>`` holds ``bytes`` (of its files, plus uploads under way)
and ``pending`` (uploads under way); its files are ``files:<tenant>`` and its batches not
yet over ``active:<tenant>`` (by the end of their window), so a count is one ``ZCARD``.
An upload first reserves its size and one file (``RESERVE``, atomic: two uploads at once
cannot both take the last byte); the file's creation turns the reservation into the file,
and a failed upload gives it back (``RELEASE``). ``uploads`` (id → ``tenant|bytes``) and
``upload_at`` (by start) hold the reservations, so the sweeper frees those of a replica
that died. Files that expire are in ``fexp`` (and ``fexp:<tenant>``) by ``expires_at``,
batches that are over in ``ended`` by the time they ended.
"""

from __future__ import annotations

from typing import Any

import redis.asyncio as aioredis

from sluicegate.batches.batch_backend import UPLOAD_TTL_S, Quota, QuotaExceededError, Swept
from sluicegate.batches.redis import batch_scripts as redis_lua
from sluicegate.batches.redis.lifecycle import as_str

RESERVE = """
-- ARGV: tenant, id, bytes, now, max bytes ('' none), max files ('' none)
local tenant, id, size, now = ARGV[1], ARGV[2], tonumber(ARGV[3]), ARGV[4]
local usage = B .. 'usage:' .. tenant
local used = tonumber(redis.call('HGET', usage, 'bytes') or '0')
local pending = tonumber(redis.call('HGET', usage, 'pending') or '0')
local over
if ARGV[6] ~= ''
    and redis.call('ZCARD', B .. 'files:' .. tenant) + pending + 1 > tonumber(ARGV[6]) then
  over = 'files'
elseif ARGV[5] ~= '' and used + size > tonumber(ARGV[5]) then
  over = 'bytes'
end
if over then
  local first = redis.call('ZRANGE', B .. 'fexp:' .. tenant, 0, 0, 'WITHSCORES')
  return {over, first[2] or ''}
end
redis.call('HINCRBY', usage, 'bytes', size)
redis.call('HINCRBY', usage, 'pending', 1)
redis.call('HSET', B .. 'uploads', id, tenant .. '|' .. size)
redis.call('ZADD', B .. 'upload_at', now, id)
return 1
"""

RELEASE = """
-- ARGV: id. An upload that will not become a file: its lines and its reservation go.
local id = ARGV[1]
if redis.call('EXISTS', B .. 'f:' .. id) == 0 then redis.call('UNLINK', B .. 'fl:' .. id) end
redis.call('ZREM', B .. 'upload_at', id)
local held = redis.call('HGET', B .. 'uploads', id)
if not held then return 0 end
local tenant, size = string.match(held, '^(.*)|(%d+)$')
redis.call('HDEL', B .. 'uploads', id)
redis.call('HINCRBY', B .. 'usage:' .. tenant, 'bytes', -tonumber(size))
redis.call('HINCRBY', B .. 'usage:' .. tenant, 'pending', -1)
return 1
"""

PURGE_BATCH = """
-- ARGV: id, due. A batch over since before due goes, with its counters.
local id, due = ARGV[1], tonumber(ARGV[2])
local bk = B .. 'b:' .. id
local status = redis.call('HGET', bk, 'status')
local at = redis.call('ZSCORE', B .. 'ended', id)
if not status then
  redis.call('ZREM', B .. 'ended', id)
  return 0
end
if ACTIVE[status] or not at or tonumber(at) > due then return 0 end
local tenant = redis.call('HGET', bk, 'tenant')
redis.call('DEL', bk)
for _, name in ipairs({'n', 'body', 'cid', 'model', 'att', 'own', 'res'}) do
  redis.call('UNLINK', B .. name .. ':' .. id)
end
redis.call('ZREM', B .. 'batches:' .. tenant, id)
redis.call('ZREM', B .. 'ended', id)
redis.call('HINCRBY', B .. 'nstatus', status, -1)
return 1
"""

SCRIPTS = {"RESERVE": RESERVE, "RELEASE": RELEASE, "PURGE_BATCH": PURGE_BATCH}


def _limit(value: int | None) -> str:
    return "" if value is None else str(value)


def refusal(reply: Any, limit: int | None) -> QuotaExceededError:
    """The ``QuotaExceededError`` of a script's ``{kind, soonest}`` refusal."""
    kind, soonest = (as_str(part) for part in reply)
    return QuotaExceededError(kind, limit or 0, float(soonest) if soonest else None)


class RedisRetention:
    """Reservations, releases and the sweep of ``RedisBatches``."""

    def __init__(self, client: aioredis.Redis, base: str) -> None:
        self._redis = client
        self.base = base
        sources = {**SCRIPTS, "DELETE_FILE": redis_lua.SCRIPTS["DELETE_FILE"]}
        self._scripts = {
            name: client.register_script(redis_lua.PRELUDE + source)
            for name, source in sources.items()
        }

    async def _run(self, script: str, *args: object) -> Any:
        return await self._scripts[script](keys=[self.base], args=list(args))  # type: ignore[arg-type]

    async def reserve(self, tenant: str, file_id: str, size: int, quota: Quota, now: int) -> None:
        """Hold ``size`` bytes and one file of the tenant's quota for an upload;
        ``QuotaExceededError`` if they do not fit."""
        reply = await self._run(
            "RESERVE", tenant, file_id, size, now, _limit(quota.max_bytes), _limit(quota.max_files)
        )
        if isinstance(reply, list):
            kind = as_str(reply[0])
            raise refusal(reply, quota.max_files if kind == "files" else quota.max_bytes)

    async def release(self, file_id: str) -> None:
        """Give back an upload's reservation and drop its lines (idempotent)."""
        await self._run("RELEASE", file_id)

    async def sweep(self, now: int, batch_retention_s: int | None, limit: int) -> Swept:
        """See ``BatchBackend.sweep``."""
        files = batches = uploads = 0
        for raw in await self._redis.zrangebyscore(
            self.base + "fexp", "-inf", now, start=0, num=limit
        ):
            files += int(await self._run("DELETE_FILE", as_str(raw), "", now))
        for raw in await self._redis.zrangebyscore(
            self.base + "upload_at", "-inf", now - UPLOAD_TTL_S, start=0, num=limit
        ):
            uploads += int(await self._run("RELEASE", as_str(raw)))
        if batch_retention_s is not None:
            due = now - batch_retention_s
            for raw in await self._redis.zrangebyscore(
                self.base + "ended", "-inf", due, start=0, num=limit
            ):
                batches += int(await self._run("PURGE_BATCH", as_str(raw), due))
        return Swept(files=files, batches=batches, uploads=uploads)
