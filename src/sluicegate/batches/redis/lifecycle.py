"""How ``RedisBatches`` checks new batches and ends finished ones, safely from many replicas.

Both read and write many lines, so neither runs as one long Lua script (which
would stall the scheduling that shares the Redis); each is three steps:

- checking: a script takes the batch (``checker``, for ``CHECK_LEASE_S``); the
  replica reads the input and writes the lines under keys of its own
  (``stage:<token>:…``, which expire); a script then moves them into place and
  the batch to ``in_progress`` (or ``failed``) if this replica still holds it;
- ending: a script marks the batch ``ending`` (after which results are ignored
  and its lines no longer run); the replica writes the output and error files
  under new ids (lists that expire); a script makes the files and the final
  status if the batch is still ``ending``. Replicas doing it at once each write
  files, and one commits them (the others' are deleted); a replica that dies
  leaves the batch in ``ending`` for the next ``finish_due`` of any replica.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

import orjson
import redis.asyncio as aioredis

from sluicegate.batches.batch_backend import MAX_REPORTED_ERRORS, LineReader
from sluicegate.batches.lines import LineError
from sluicegate.batches.objects import error_line, new_id
from sluicegate.batches.redis.batch_scripts import BatchScripts
from sluicegate.batches.sqlite.finishing import ENDINGS

CHUNK = 1000
"""Lines read or written per round trip."""
CHECK_LEASE_S = 300
"""A replica that died while checking a batch leaves it to the others after this."""
STAGING_TTL_S = 86_400
"""Keys written by a replica that died before it committed them expire after this."""
_LOST = ("internal_error", "The line has no result.")


def as_str(value: object) -> str:
    """A Redis reply (bytes; str with ``decode_responses``) as text."""
    return value.decode() if isinstance(value, bytes) else str(value)


def as_bytes(value: object) -> bytes:
    """A Redis reply as bytes."""
    return value if isinstance(value, bytes) else str(value).encode()


def line_member(batch_id: str, idx: int) -> str:
    """A line in a model's ``ready``/``delayed``/``leased`` sets (index zero-padded, so lines
    of one batch sort by index)."""
    return f"{batch_id}|{idx:08d}"


class RedisLifecycle:
    """``validate_pending`` and ``finish_due`` of ``RedisBatches`` (output and error files
    expire ``file_retention_s`` after they are written; None: never)."""

    def __init__(
        self, client: aioredis.Redis, scripts: BatchScripts, file_retention_s: int | None = None
    ) -> None:
        self._redis = client
        self.base = scripts.base
        self.file_retention_s = file_retention_s
        self._run = scripts.run

    async def _ids(self, key: str) -> list[str]:
        return [as_str(item) for item in await self._redis.zrange(self.base + key, 0, -1)]

    async def validate_pending(self, read: LineReader, now: int) -> list[tuple[str, str]]:
        """Check every ``validating`` batch no other replica is checking."""
        changed = []
        for batch_id in await self._ids("st:validating"):
            status = await self._validate(batch_id, read, now)
            if status is not None:
                changed.append((batch_id, status))
        return changed

    async def _validate(self, batch_id: str, read: LineReader, now: int) -> str | None:
        token = new_id("")
        taken = await self._run("begin_check", batch_id, token, now, now + CHECK_LEASE_S)
        if taken is None:
            return None
        endpoint, lane, input_id = (as_str(part) for part in taken)
        stage = f"{self.base}stage:{token}:"
        staged = {stage + name for name in ("body", "cid", "model", "res")}
        runnable: Counter[str] = Counter()
        problems: list[dict[str, object]] = []
        failure: list[dict[str, object]] | None = None
        seen: set[str] = set()
        errors = total = 0
        try:
            while failure is None:
                chunk = await self._redis.lrange(
                    f"{self.base}fl:{input_id}", total, total + CHUNK - 1
                )
                if not chunk:
                    break
                fields: dict[str, dict[Any, Any]] = {name: {} for name in staged}
                ready: dict[str, dict[str, int]] = {}
                for idx, text in enumerate(chunk, start=total):
                    line = read(endpoint, lane, as_bytes(text))
                    if line.custom_id is not None and line.custom_id in seen:
                        message = f"custom_id {line.custom_id!r} appears more than once"
                        failure = [_problem("duplicate_custom_id", message, idx + 1)]
                        break
                    if line.custom_id is not None:
                        seen.add(line.custom_id)
                    if isinstance(line, LineError):
                        errors += 1
                        text_ = error_line(line.custom_id, line.code, line.message)
                        fields[stage + "res"][str(idx)] = b"0" + text_
                        if len(problems) < MAX_REPORTED_ERRORS:
                            problems.append(_problem(line.code, line.message, idx + 1))
                        continue
                    fields[stage + "body"][str(idx)] = line.body
                    fields[stage + "cid"][str(idx)] = line.custom_id.encode()
                    fields[stage + "model"][str(idx)] = line.model.encode()
                    ready.setdefault(line.model, {})[line_member(batch_id, idx)] = 0
                    runnable[line.model] += 1
                total += len(chunk)
                if failure is None:
                    await self._stage(stage, fields, ready, staged)
            if failure is None and total == 0:
                failure = [_problem("empty_file", "the input file is gone or has no lines", None)]
            if failure is None and not runnable:
                failure = problems
            models = [part for model, n in sorted(runnable.items()) for part in (model, n)]
            errors_json = "" if failure is None else orjson.dumps(failure).decode()
            done = await self._run(
                "end_check", batch_id, token, now, total, errors_json, errors, *models
            )
        finally:
            await self._redis.unlink(*staged, *(stage + "ready:" + model for model in runnable))
        if not done:
            return None
        return "in_progress" if failure is None else "failed"

    async def _stage(
        self,
        stage: str,
        fields: dict[str, dict[Any, Any]],
        ready: dict[str, dict[str, int]],
        staged: set[str],
    ) -> None:
        async with self._redis.pipeline(transaction=False) as pipe:
            for key, mapping in fields.items():
                if mapping:
                    pipe.hset(key, mapping=mapping)
            for model, members in ready.items():
                pipe.zadd(stage + "ready:" + model, members)
            for key in (*staged, *(stage + "ready:" + model for model in ready)):
                pipe.expire(key, STAGING_TTL_S)
            await pipe.execute()

    async def finish_due(self, now: int) -> list[tuple[str, str]]:
        """End every batch that is due: cancelled, then completed (every line answered), then
        expired; and finish the endings another replica left half done."""
        for batch_id in await self._ids("st:cancelling"):
            await self._run("begin_end", batch_id, "cancelled", now)
        for batch_id in await self._ids("full"):
            await self._run("begin_end", batch_id, "completed", now)
        expired = await self._redis.zrangebyscore(self.base + "expiry", "-inf", now)
        for raw_id in expired:
            await self._run("begin_end", as_str(raw_id), "expired", now)
        ended = []
        for batch_id in await self._ids("ending"):
            kind = await self._redis.hget(f"{self.base}b:{batch_id}", "ending")
            if kind is not None and await self._end(batch_id, as_str(kind), now):
                ended.append((batch_id, as_str(kind)))
        return ended

    async def _end(self, batch_id: str, kind: str, now: int) -> bool:
        """Write the batch's files (every line once, by index) and commit them with its end."""
        total = int(await self._redis.hget(f"{self.base}b:{batch_id}", "total") or 0)
        code, message = ENDINGS[kind][1:] if kind in ENDINGS else _LOST
        files = {ok: _Written(new_id("file-")) for ok in (True, False)}
        won = False
        try:
            for start in range(0, total, CHUNK):
                indexes = list(range(start, min(total, start + CHUNK)))
                found = await self._redis.hmget(f"{self.base}res:{batch_id}", indexes)
                missing = [idx for idx, text in zip(indexes, found, strict=True) if text is None]
                cids = dict(zip(missing, await self._cids(batch_id, missing), strict=True))
                out: dict[bool, list[bytes]] = {True: [], False: []}
                for idx, text in zip(indexes, found, strict=True):
                    if text is None:
                        out[False].append(error_line(cids[idx], code, message))
                    else:
                        line = as_bytes(text)
                        out[line[:1] == b"1"].append(line[1:])
                async with self._redis.pipeline(transaction=False) as pipe:
                    for ok, lines in out.items():
                        if lines:
                            key = f"{self.base}fl:{files[ok].file_id}"
                            pipe.rpush(key, *lines)
                            pipe.expire(key, STAGING_TTL_S)
                            files[ok].lines += len(lines)
                            files[ok].size += sum(len(line) + 1 for line in lines)
                    await pipe.execute()
            written = [part for ok in (True, False) for part in files[ok].parts()]
            expires = "" if self.file_retention_s is None else now + self.file_retention_s
            won = bool(await self._run("end", batch_id, kind, now, *written, expires))
        finally:
            if not won:
                await self._redis.unlink(*(f"{self.base}fl:{f.file_id}" for f in files.values()))
        return won

    async def _cids(self, batch_id: str, indexes: list[int]) -> list[str | None]:
        if not indexes:
            return []
        found = await self._redis.hmget(f"{self.base}cid:{batch_id}", indexes)
        return [None if cid is None else as_str(cid) for cid in found]


@dataclass(slots=True)
class _Written:
    file_id: str
    lines: int = 0
    size: int = 0

    def parts(self) -> tuple[str, int, int]:
        return self.file_id, self.lines, self.size


def _problem(code: str, message: str, line: int | None) -> dict[str, object]:
    return {"code": code, "message": message, "line": line, "param": None}
