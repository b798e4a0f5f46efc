"""The distributed batch backend: batch state in the shared Redis of distributed mode.

Any replica serves any file or batch and runs any line. Every key starts with
``{<prefix>:batch}:`` (one hash tag, so each Lua script, ``scripts/*.lua``, may
touch any of them):

- ``f:<id>`` a file's fields (a hash), ``fl:<id>`` its lines (a list),
  ``files:<tenant>`` the tenant's files by creation (a sorted set); ``seq`` the
  counter that orders files and batches; quotas and expiry: ``retention``;
  reading them back and listing them: ``records``;
- ``b:<id>`` a batch's fields, ``batches:<tenant>`` the tenant's batches,
  ``st:<status>`` the batches in each unfinished status, ``nstatus`` batches per
  status, ``expiry`` running batches by ``expires_at``, ``full`` running batches
  whose every line has a result, ``ending`` batches whose files are being written;
- per batch, hashes from line index to its ``body``, ``cid`` (custom_id),
  ``model``, ``att`` (failed attempts), ``own`` (the runner holding it) and
  ``res`` (its result: ``1`` or ``0`` then the line of the output or error file),
  and ``n:<id>`` its counters (completed, failed, tokens, lines per model and state);
- per model, the lines that can run as sorted sets of ``<batch>|<index>``:
  ``ready:<model>`` (by batch age, then index), ``delayed:<model>`` (by
  ``not_before``) and ``leased:<model>`` (by the end of their lease); and the
  order of claims: ``turns:<model>``, the batches that may have ready lines by
  tenant then age, and ``turn:<model>``, where the round-robin across tenants,
  then each tenant's batches, stands (``scripts/claim.lua``).

Leases are wall-clock times from the callers, as in the SQLite backend, so a
replica that dies leaves lines that any other claims once their lease ends.
Sorted sets rather than a Stream with a consumer group: a Stream's idle times
run on Redis's clock, so they could honour neither ``claim``'s ``now`` and
``lease_s`` nor ``renew``'s ``until`` (nor be tested in virtual time as the
SQLite backend is), and each claim, result and retry must change the line's
counters and its batch's state in the same script anyway.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Iterable, Sequence
from typing import Any

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry as RedisRetry
from redis.backoff import NoBackoff
from redis.exceptions import RedisError
from redis.typing import EncodableT

from sluicegate.batches.batch_backend import (
    NO_QUOTA,
    PAGE_LINES,
    UPLOAD_TTL_S,
    Claim,
    Counts,
    LineReader,
    NewBatch,
    NewFile,
    Progress,
    Quota,
    Record,
    Result,
    Retry,
    Swept,
    take_chunk,
)
from sluicegate.batches.objects import new_id
from sluicegate.batches.redis.admin_keys import RedisAdmin
from sluicegate.batches.redis.batch_scripts import BatchScripts
from sluicegate.batches.redis.lifecycle import RedisLifecycle, as_bytes, as_str
from sluicegate.batches.redis.record_reads import BATCH_COLUMNS, batch_record, file_record, listing
from sluicegate.batches.redis.retention import RedisRetention, refusal
from sluicegate.store.store_errors import storage_error

log = logging.getLogger("sluicegate.batches")

_UNFINISHED = ("in_progress", "finalizing", "cancelling")
_STATES = {"q": "queued", "r": "running", "c": "completed", "f": "failed"}


class RedisBatches:
    """``BatchBackend`` in the Redis at ``url`` (redis://, rediss:// or unix://), under the
    keys of ``prefix`` (``distributed.key_prefix``); output and error files expire
    ``file_retention_s`` after they are written (None: never).

    Every call fails within ``timeout_s`` per round trip (``batches.store_timeout_s``) and is
    never retried by the client: a write retried after a timeout could apply twice (an
    ``RPUSH`` of lines). The next call connects again.
    """

    def __init__(
        self,
        url: str,
        *,
        prefix: str,
        file_retention_s: int | None = None,
        timeout_s: float = 2.0,
    ) -> None:
        self.url = url
        self.file_retention_s = file_retention_s
        self.timeout_s = timeout_s
        self.base = f"{{{prefix}:batch}}:"
        self._client: aioredis.Redis | None = None
        self._scripts: BatchScripts | None = None
        self._lifecycle: RedisLifecycle | None = None
        self._retention: RedisRetention | None = None
        self._admin: RedisAdmin | None = None

    @property
    def _redis(self) -> aioredis.Redis:
        if self._client is None:
            raise RuntimeError("RedisBatches is not open")
        return self._client

    def _key(self, kind: str, name: str = "") -> str:
        return f"{self.base}{kind}{name}"

    async def _run(self, script: str, *args: EncodableT) -> Any:
        if self._scripts is None:
            raise RuntimeError("RedisBatches is not open")
        return await self._scripts.run(script, *args)

    async def open(self) -> None:
        """Connect, and check that Redis answers; one that does not is logged, and the lane
        starts anyway (its calls fail until Redis answers: 503 in the API)."""
        client = aioredis.Redis.from_url(
            self.url,
            socket_timeout=self.timeout_s,
            socket_connect_timeout=self.timeout_s,
            retry=RedisRetry(NoBackoff(), 0),
        )
        try:
            await client.ping()
        except RedisError as exc:
            reason = storage_error(exc)
            log.warning(
                "the batch store does not answer yet (%s): its calls fail until it does", reason
            )
        self._client = client
        scripts = BatchScripts(client, self.base)
        self._scripts = scripts
        self._lifecycle = RedisLifecycle(client, scripts, self.file_retention_s)
        self._retention = RedisRetention(client, scripts)
        cancel = functools.partial(scripts.run, "cancel")
        self._admin = RedisAdmin(client, self.base, self.record, cancel)

    async def close(self) -> None:
        """Disconnect."""
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    async def create_file(
        self, file: NewFile, lines: Iterable[bytes], *, quota: Quota = NO_QUOTA
    ) -> Record:
        """See ``BatchBackend``: the size is reserved, then the lines go to a list that
        expires until the file exists."""
        assert self._retention is not None
        file_id = new_id("file-")
        key = self._key("fl:", file_id)
        await self._retention.reserve(file, file_id, quota)
        source, count = iter(lines), 0
        try:
            while chunk := await asyncio.to_thread(take_chunk, source):
                async with self._redis.pipeline(transaction=False) as pipe:
                    pipe.rpush(key, *chunk)
                    pipe.expire(key, UPLOAD_TTL_S)
                    await pipe.execute()
                count += len(chunk)
            row = file.columns(file_id, count)
            fields = [str(part) for pair in row.items() if pair[1] is not None for part in pair]
            expires = "" if file.expires_at is None else str(file.expires_at)
            seq = await self._run("create", "file", file_id, file.tenant, "", expires, *fields)
            if seq is None:
                raise RuntimeError("the upload's reservation was swept before it finished")
        except BaseException as exc:
            failure = storage_error(exc)
            if failure is None or failure.full:
                # Out of memory, the release (it drops the lines) is what frees room; an
                # unreachable Redis would only make the answer wait another timeout (the
                # lines expire by themselves and the sweeper frees the reservation).
                await asyncio.shield(self._retention.release(file_id))
            raise
        return {"seq": int(seq), **row}

    async def get_file(self, tenant: str, file_id: str) -> Record | None:
        """See ``BatchBackend``."""
        raw = await self._redis.hgetall(self._key("f:", file_id))
        row = file_record(raw) if raw else None
        return row if row is not None and row["tenant"] == tenant else None

    async def list_files(
        self, tenant: str, purpose: str | None, after: str | None, limit: int
    ) -> tuple[list[Record], bool]:
        """See ``BatchBackend``."""

        def keep(row: Record) -> bool:
            return purpose in (None, row["purpose"])

        return await listing(self._redis, self.base, "files:", tenant, after, limit, keep)

    async def file_page(self, file_id: str, start: int) -> list[bytes]:
        """See ``BatchBackend``."""
        lines = await self._redis.lrange(self._key("fl:", file_id), start, start + PAGE_LINES - 1)
        return [as_bytes(line) for line in lines]

    async def delete_file(self, tenant: str, file_id: str) -> bool:
        """See ``BatchBackend``."""
        return bool(await self._run("delete_file", file_id, tenant, ""))

    async def create_batch(self, batch: NewBatch, *, quota: Quota = NO_QUOTA) -> Record:
        """See ``BatchBackend``."""
        row: Record = dict.fromkeys(BATCH_COLUMNS)
        row.update(batch.columns(new_id("batch_")), total=0)
        fields = [str(x) for k, v in row.items() if v is not None and k != "seq" for x in (k, v)]
        limit = quota.max_active_batches
        seq = await self._run(
            "create", "batch", row["id"], batch.tenant, "" if limit is None else limit,
            row["expires_at"], *fields,
        )  # fmt: skip
        if isinstance(seq, list):
            raise refusal(seq, limit)
        row["seq"] = int(seq)
        return row

    async def get_batch(self, tenant: str, batch_id: str) -> Record | None:
        """See ``BatchBackend``."""
        raw = await self._redis.hgetall(self._key("b:", batch_id))
        row = batch_record(raw) if raw else None
        return row if row is not None and row["tenant"] == tenant else None

    async def list_batches(
        self, tenant: str, after: str | None, limit: int
    ) -> tuple[list[Record], bool]:
        """See ``BatchBackend``."""
        return await listing(self._redis, self.base, "batches:", tenant, after, limit)

    async def cancel_batch(self, tenant: str, batch_id: str, now: int) -> Record | None:
        """See ``BatchBackend``."""
        if not await self._run("cancel", batch_id, tenant, now):
            return None
        return await self.get_batch(tenant, batch_id)

    async def batch_counts(self, batch_id: str) -> Counts:
        """See ``BatchBackend``."""
        values = await self._redis.hmget(
            self._key("n:", batch_id), ["completed", "failed", "prompt_tokens", "completion_tokens"]
        )
        return Counts(*(int(value or 0) for value in values))

    async def validate_pending(self, read: LineReader, now: int) -> list[tuple[str, str]]:
        """See ``BatchBackend`` (``lifecycle``)."""
        assert self._lifecycle is not None
        return await self._lifecycle.validate_pending(read, now)

    async def finish_due(self, now: int) -> list[tuple[str, str]]:
        """See ``BatchBackend`` (``lifecycle``)."""
        assert self._lifecycle is not None
        return await self._lifecycle.finish_due(now)

    async def sweep(self, now: int, batch_retention_s: int | None, limit: int) -> Swept:
        """See ``BatchBackend`` (``retention``)."""
        assert self._retention is not None
        return await self._retention.sweep(now, batch_retention_s, limit)

    async def claim(
        self, model: str, owner: str, limit: int, now: float, lease_s: float
    ) -> list[Claim]:
        """See ``BatchBackend``: lines whose lease ran out first, then ready ones in turn."""
        if limit <= 0:
            return []
        rows = await self._run("claim", model, owner, limit, repr(now), repr(now + lease_s))
        return [
            Claim(as_str(bid), int(idx), as_str(cid), model, as_bytes(body), int(att))
            for bid, idx, cid, body, att in rows
        ]

    async def renew(self, owner: str, claims: Sequence[Claim], until: float) -> None:
        """See ``BatchBackend``: only the lines ``owner`` still holds."""
        if claims:
            args = [part for c in claims for part in (c.model, c.batch_id, c.idx)]
            await self._run("renew", owner, repr(until), *args)

    async def record(self, results: Sequence[Result], retries: Sequence[Retry], owner: str) -> None:
        """See ``BatchBackend``."""
        if not results and not retries:
            return
        args: list[EncodableT] = [owner, len(results)]
        for r in results:
            args += [r.batch_id, r.idx, "1" if r.ok else "0", r.text]
            args += [r.prompt_tokens, r.completion_tokens]
        for retry in retries:
            args += [retry.claim.batch_id, retry.claim.idx, repr(retry.not_before)]
            args.append("1" if retry.failed else "0")
        await self._run("record", *args)

    async def statuses(self, batch_ids: Sequence[str]) -> dict[str, str]:
        """See ``BatchBackend``."""
        async with self._redis.pipeline(transaction=False) as pipe:
            for batch_id in batch_ids:
                pipe.hget(self._key("b:", batch_id), "status")
            found = await pipe.execute()
        return {bid: as_str(st) for bid, st in zip(batch_ids, found, strict=True) if st}

    async def batch_route(self, batch_id: str) -> tuple[str, str, str] | None:
        """See ``BatchBackend``."""
        tenant, lane, endpoint = await self._redis.hmget(
            self._key("b:", batch_id), ["tenant", "lane", "endpoint"]
        )
        if tenant is None or lane is None or endpoint is None:
            return None
        return as_str(tenant), as_str(lane), as_str(endpoint)

    async def progress(self) -> Progress:
        """See ``BatchBackend``: the counters of each unfinished batch, summed."""
        async with self._redis.pipeline(transaction=False) as pipe:
            for status in _UNFINISHED:
                pipe.zrange(self._key("st:", status), 0, -1)
            ids = [bid for found in await pipe.execute() for bid in found]
        async with self._redis.pipeline(transaction=False) as pipe:
            for batch_id in ids:
                pipe.hgetall(self._key("n:", as_str(batch_id)))
            pipe.hgetall(self._key("nstatus"))
            *counters, by_status = await pipe.execute()
        lines: dict[tuple[str, str], int] = {}
        for raw in counters:
            for name, value in raw.items():
                state, bar, model = as_str(name).partition("|")
                if bar and int(value) > 0:
                    key = (model, _STATES[state])
                    lines[key] = lines.get(key, 0) + int(value)
        batches = {as_str(st): int(n) for st, n in by_status.items() if int(n) > 0}
        return lines, batches

    async def admin_batches(
        self, tenant: str | None, after: str | None, limit: int
    ) -> tuple[list[Record], bool]:
        """See ``BatchBackend`` (``admin_keys``)."""
        assert self._admin is not None
        return await self._admin.listing(tenant, after, limit, batch_record)

    async def active_batches(self) -> list[tuple[str, str]]:
        """See ``BatchBackend`` (``admin_keys``)."""
        assert self._admin is not None
        return await self._admin.active()

    async def stop_batch(self, batch_id: str, code: str, message: str, now: int) -> bool:
        """See ``BatchBackend`` (``admin_keys``)."""
        assert self._admin is not None
        return await self._admin.stop(batch_id, code, message, now)
