"""The embedded batch backend: one SQLite file (WAL), used from a thread of its own.

SQLite calls block, and a commit waits for the disk: every call runs on one
dedicated thread, and the event loop goes on serving requests meanwhile.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import ParamSpec, TypeVar

from sluicegate.batches.admin_store import AdminStore
from sluicegate.batches.backend import (
    Claim,
    Counts,
    LineReader,
    Progress,
    Record,
    Result,
    Retry,
)
from sluicegate.batches.batch_store import BatchStore
from sluicegate.batches.db import Database
from sluicegate.batches.file_store import FileStore
from sluicegate.batches.finish import Finisher
from sluicegate.batches.line_store import LineStore

P = ParamSpec("P")
T = TypeVar("T")


class SqliteBatches:
    """``BatchBackend`` over the SQLite database at ``path``."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="sluicegate-batches")
        self._db: Database | None = None
        self._files: FileStore
        self._batches: BatchStore
        self._lines: LineStore
        self._finisher: Finisher
        self._admin: AdminStore

    async def _call(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._thread, functools.partial(fn, *args, **kwargs))

    async def open(self) -> None:
        """Open (or create) the database."""
        db = await self._call(Database, self.path)
        self._db = db
        self._files = FileStore(db)
        self._batches = BatchStore(db)
        self._lines = LineStore(db)
        self._finisher = Finisher(db)
        self._admin = AdminStore(db)

    async def close(self) -> None:
        """Close the database and stop its thread."""
        if self._db is not None:
            await self._call(self._db.close)
            self._db = None
        self._thread.shutdown(wait=True)

    async def create_file(
        self, tenant: str, purpose: str, filename: str, size: int, lines: Iterable[bytes], now: int
    ) -> Record:
        """See ``BatchBackend``."""
        return await self._call(self._files.create, tenant, purpose, filename, size, lines, now)

    async def get_file(self, tenant: str, file_id: str) -> Record | None:
        """See ``BatchBackend``."""
        return await self._call(self._files.get, tenant, file_id)

    async def list_files(
        self, tenant: str, purpose: str | None, after: str | None, limit: int
    ) -> tuple[list[Record], bool]:
        """See ``BatchBackend``."""
        return await self._call(self._files.listing, tenant, purpose, after, limit)

    async def file_page(self, file_id: str, start: int) -> list[bytes]:
        """See ``BatchBackend``."""
        return await self._call(self._files.page, file_id, start)

    async def delete_file(self, tenant: str, file_id: str) -> bool:
        """See ``BatchBackend``."""
        return await self._call(self._files.delete, tenant, file_id)

    async def create_batch(
        self,
        tenant: str,
        input_file_id: str,
        endpoint: str,
        window: str,
        window_s: int,
        lane: str,
        metadata: dict[str, str] | None,
        now: int,
    ) -> Record:
        """See ``BatchBackend``."""
        return await self._call(
            self._batches.create,
            tenant,
            input_file_id,
            endpoint,
            window,
            window_s,
            lane,
            metadata,
            now,
        )

    async def get_batch(self, tenant: str, batch_id: str) -> Record | None:
        """See ``BatchBackend``."""
        return await self._call(self._batches.get, tenant, batch_id)

    async def list_batches(
        self, tenant: str, after: str | None, limit: int
    ) -> tuple[list[Record], bool]:
        """See ``BatchBackend``."""
        return await self._call(self._batches.listing, tenant, after, limit)

    async def cancel_batch(self, tenant: str, batch_id: str, now: int) -> Record | None:
        """See ``BatchBackend``."""
        return await self._call(self._batches.cancel, tenant, batch_id, now)

    async def batch_counts(self, batch_id: str) -> Counts:
        """See ``BatchBackend``."""
        return await self._call(self._batches.counts, batch_id)

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
