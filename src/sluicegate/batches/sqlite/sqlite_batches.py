"""The embedded batch backend: one SQLite file (WAL), used from a thread of its own.

SQLite calls block, and a commit waits for the disk: every write runs on one
dedicated thread, and the event loop goes on serving requests meanwhile. Writes take
turns on that thread, so none may be long: an upload is written in bounded steps
(``FileStore``), each its own call, and another tenant's write waits for one step at
most, not for the whole file. Reads a client makes (a file, a batch, a listing, a
page of lines) run on a second thread with a read-only connection: in WAL mode they
wait for no write at all, however slow the disk is to take a commit.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import ParamSpec, TypeVar

from sluicegate.batches.batch_backend import (
    NO_QUOTA,
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
)
from sluicegate.batches.sqlite.admin_rows import AdminStore
from sluicegate.batches.sqlite.batch_rows import BatchStore
from sluicegate.batches.sqlite.database import Database, Reader
from sluicegate.batches.sqlite.file_rows import FileStore
from sluicegate.batches.sqlite.finishing import Finisher
from sluicegate.batches.sqlite.line_rows import LineStore

P = ParamSpec("P")
T = TypeVar("T")


class SqliteBatches:
    """``BatchBackend`` over the SQLite database at ``path``; output and error files, and
    files stored before they had an expiry, expire ``file_retention_s`` after they were
    written (None: never)."""

    def __init__(self, path: str, *, file_retention_s: int | None = None) -> None:
        self.path = path
        self.file_retention_s = file_retention_s
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="sluicegate-batches")
        self._read_thread = ThreadPoolExecutor(1, thread_name_prefix="sluicegate-batch-reads")
        self._db: Database | None = None
        self._reader: Reader | None = None
        self._read_files: FileStore
        self._read_batches: BatchStore
        self._files: FileStore
        self._batches: BatchStore
        self._lines: LineStore
        self._finisher: Finisher
        self._admin: AdminStore

    async def _call(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._thread, functools.partial(fn, *args, **kwargs))

    async def _read(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        loop = asyncio.get_running_loop()
        call = functools.partial(fn, *args, **kwargs)
        return await loop.run_in_executor(self._read_thread, call)

    async def open(self) -> None:
        """Open (or create) the database."""
        db = await self._call(Database, self.path)
        self._db = db
        self._files = FileStore(db)
        self._batches = BatchStore(db)
        self._lines = LineStore(db)
        self._finisher = Finisher(db, self.file_retention_s)
        if self.file_retention_s is not None:
            await self._call(self._files.expire_unexpiring, self.file_retention_s)
        self._admin = AdminStore(db)
        reader = await self._read(Reader, db)
        self._reader = reader
        self._read_files = FileStore(reader)
        self._read_batches = BatchStore(reader)

    async def close(self) -> None:
        """Close the database and stop its thread."""
        if self._reader is not None:
            await self._read(self._reader.close)
            self._reader = None
        if self._db is not None:
            await self._call(self._db.close)
            self._db = None
        self._read_thread.shutdown(wait=True)
        self._thread.shutdown(wait=True)

    async def create_file(
        self, file: NewFile, lines: Iterable[bytes], *, quota: Quota = NO_QUOTA
    ) -> Record:
        """See ``BatchBackend``: reserve, then one call per chunk of lines, then commit."""
        file_id = await self._call(self._files.reserve, file, quota)
        source, count = iter(lines), 0
        try:
            while written := await self._call(self._files.write, file_id, source, count):
                count += written
            return await self._call(self._files.commit, file_id, file, count)
        except BaseException:
            await asyncio.shield(self._call(self._files.abandon, file_id))
            raise

    async def get_file(self, tenant: str, file_id: str) -> Record | None:
        """See ``BatchBackend``."""
        return await self._read(self._read_files.get, tenant, file_id)

    async def list_files(
        self, tenant: str, purpose: str | None, after: str | None, limit: int
    ) -> tuple[list[Record], bool]:
        """See ``BatchBackend``."""
        return await self._read(self._read_files.listing, tenant, purpose, after, limit)

    async def file_page(self, file_id: str, start: int) -> list[bytes]:
        """See ``BatchBackend``."""
        return await self._read(self._read_files.page, file_id, start)

    async def delete_file(self, tenant: str, file_id: str) -> bool:
        """See ``BatchBackend``."""
        return await self._call(self._files.delete, tenant, file_id)

    async def create_batch(self, batch: NewBatch, *, quota: Quota = NO_QUOTA) -> Record:
        """See ``BatchBackend``."""
        return await self._call(self._batches.create, batch, quota)

    async def get_batch(self, tenant: str, batch_id: str) -> Record | None:
        """See ``BatchBackend``."""
        return await self._read(self._read_batches.get, tenant, batch_id)

    async def list_batches(
        self, tenant: str, after: str | None, limit: int
    ) -> tuple[list[Record], bool]:
        """See ``BatchBackend``."""
        return await self._read(self._read_batches.listing, tenant, after, limit)

    async def cancel_batch(self, tenant: str, batch_id: str, now: int) -> Record | None:
        """See ``BatchBackend``."""
        return await self._call(self._batches.cancel, tenant, batch_id, now)

    async def batch_counts(self, batch_id: str) -> Counts:
        """See ``BatchBackend``."""
        return await self._read(self._read_batches.counts, batch_id)

    async def validate_pending(self, read: LineReader, now: int) -> list[tuple[str, str]]:
        """See ``BatchBackend``."""
        changed = []
        for batch_id in await self._call(self._lines.batch_ids, "validating"):
            status = await self._call(self._lines.validate, batch_id, read, now)
            if status is not None:
                changed.append((batch_id, status))
        return changed

    async def finish_due(self, now: int) -> list[tuple[str, str]]:
        """See ``BatchBackend``."""
        return await self._call(self._finisher.finish_due, now)

    async def claim(
        self, model: str, owner: str, limit: int, now: float, lease_s: float
    ) -> list[Claim]:
        """See ``BatchBackend``."""
        return await self._call(self._lines.claim, model, owner, limit, now, lease_s)

    async def renew(self, owner: str, claims: Sequence[Claim], until: float) -> None:
        """See ``BatchBackend`` (every line the owner runs, in one statement)."""
        if claims:
            await self._call(self._lines.renew, owner, until)

    async def record(self, results: Sequence[Result], retries: Sequence[Retry], owner: str) -> None:
        """See ``BatchBackend``."""
        await self._call(self._lines.record, results, retries, owner)

    async def statuses(self, batch_ids: Sequence[str]) -> dict[str, str]:
        """See ``BatchBackend``."""
        return await self._call(self._lines.statuses, batch_ids)

    async def batch_route(self, batch_id: str) -> tuple[str, str, str] | None:
        """See ``BatchBackend``."""
        return await self._call(self._lines.batch_route, batch_id)

    async def progress(self) -> Progress:
        """See ``BatchBackend``."""
        return await self._call(self._lines.progress)

    async def sweep(self, now: int, batch_retention_s: int | None, limit: int) -> Swept:
        """See ``BatchBackend``."""
        files, uploads = await self._call(self._files.sweep, now, limit)
        batches = 0
        if batch_retention_s is not None:
            batches = await self._call(self._batches.purge, now, batch_retention_s, limit)
        return Swept(files=files, batches=batches, uploads=uploads)

    async def admin_batches(
        self, tenant: str | None, after: str | None, limit: int
    ) -> tuple[list[Record], bool]:
        """See ``BatchBackend``."""
        return await self._call(self._admin.listing, tenant, after, limit)

    async def active_batches(self) -> list[tuple[str, str]]:
        """See ``BatchBackend``."""
        return await self._call(self._admin.active)

    async def stop_batch(self, batch_id: str, code: str, message: str, now: int) -> bool:
        """See ``BatchBackend``."""
        return await self._call(self._admin.stop, batch_id, code, message, now)
