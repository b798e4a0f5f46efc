"""The admin's side of ``RedisBatches``: every tenant's batches, and stopping one for a
reason of the gateway's (its tenant is no longer configured).

There is no index of every batch: the tenants are found from their ``batches:<tenant>``
sorted sets with ``SCAN`` (the cost of the listing grows with the batch keys, which an
admin listing can afford), and their batches merged by ``seq``, which orders all of them.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any, cast

import orjson
import redis.asyncio as aioredis

from sluicegate.batches.batch_backend import Record, Result
from sluicegate.batches.objects import error_line
from sluicegate.batches.redis.lifecycle import as_str

CHUNK = 1000
"""Lines read per round trip when a batch is stopped."""
_GLOB = str.maketrans({c: f"\\{c}" for c in "*?[]\\"})


class RedisAdmin:
    """``admin_batches``, ``active_batches`` and ``stop_batch`` of ``RedisBatches``."""

    def __init__(
        self,
        client: aioredis.Redis,
        base: str,
        record: Callable[[Sequence[Result], Sequence[Any], str], Awaitable[None]],
        cancel: Callable[..., Awaitable[Any]],
    ) -> None:
        self._redis = client
        self.base = base
        self._record = record
        self._cancel = cancel
        self._tenant_of: dict[str, str] = {}  # a batch's tenant never changes

    async def _tenant_indexes(self, tenant: str | None) -> list[str]:
        index = self.base + "batches:"
        if tenant is not None:
            return [index + tenant]
        pattern = index.translate(_GLOB) + "*"
        return [as_str(key) async for key in self._redis.scan_iter(match=pattern, count=1000)]

    async def listing(
        self, tenant: str | None, after: str | None, limit: int, read: Callable[[Any], Record]
    ) -> tuple[list[Record], bool]:
        """Every tenant's batches (or ``tenant``'s) newest first, after ``after``; whether
        more follow. ``read`` turns a batch hash into a record."""
        top = "+inf"
        if after is not None:
            seq = await self._redis.hget(f"{self.base}b:{after}", "seq")
            if seq is None:
                return [], False
            top = f"({int(seq)}"
        found: list[tuple[float, str]] = []
        for key in await self._tenant_indexes(tenant):
            ids = await self._redis.zrevrangebyscore(
                key, top, "-inf", start=0, num=limit + 1, withscores=True
            )
            found += [(score, as_str(i)) for i, score in cast(list[tuple[bytes, float]], ids)]
        found.sort(reverse=True)
        async with self._redis.pipeline(transaction=False) as pipe:
            for _, batch_id in found[: limit + 1]:
                pipe.hgetall(f"{self.base}b:{batch_id}")
            raws = await pipe.execute()
        rows = [read(raw) for raw in raws if raw]
        return rows[:limit], len(rows) > limit

    async def active(self) -> list[tuple[str, str]]:
        """``(id, tenant)`` of every ``validating`` or ``in_progress`` batch."""
        ids = [
            as_str(i)
            for status in ("validating", "in_progress")
            for i in await self._redis.zrange(f"{self.base}st:{status}", 0, -1)
        ]
        known = {i: t for i in ids if (t := self._tenant_of.get(i)) is not None}
        unknown = [i for i in ids if i not in known]
        async with self._redis.pipeline(transaction=False) as pipe:
            for batch_id in unknown:
                pipe.hget(f"{self.base}b:{batch_id}", "tenant")
            tenants = await pipe.execute()
        known |= {i: as_str(t) for i, t in zip(unknown, tenants, strict=True) if t is not None}
        self._tenant_of = known  # only the active ones stay
        return [(i, known[i]) for i in ids if i in known]

    async def stop(self, batch_id: str, code: str, message: str, now: int) -> bool:
        """The batch ``cancelling`` with ``code`` in its errors, then error lines ``code``
        for its lines without a result (recorded as results, a chunk at a time: the first
        result of a line wins, and none runs once its batch is cancelling)."""
        bk = f"{self.base}b:{batch_id}"
        status, tenant, total = await self._redis.hmget(bk, ["status", "tenant", "total"])
        if status is None or as_str(status) not in ("validating", "in_progress"):
            return False
        errors = [{"code": code, "message": message, "line": None, "param": None}]
        await self._redis.hset(bk, "errors", orjson.dumps(errors))
        await self._cancel(batch_id, as_str(tenant), now)
        count = int(total or 0)
        for start in range(0, count, CHUNK):
            indexes = list(range(start, min(count, start + CHUNK)))
            async with self._redis.pipeline(transaction=False) as pipe:
                pipe.hmget(f"{self.base}res:{batch_id}", indexes)
                pipe.hmget(f"{self.base}cid:{batch_id}", indexes)
                results, cids = await pipe.execute()
            lines = [
                Result(batch_id, idx, False, error_line(as_str(cid), code, message))
                for idx, result, cid in zip(indexes, results, cids, strict=True)
                if result is None and cid is not None
            ]
            await self._record(lines, [], "")
        return True
