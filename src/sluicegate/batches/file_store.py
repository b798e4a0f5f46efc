"""Files in the batch database: uploaded inputs and the output and error files of batches.

A file is a row in ``files`` and its lines in ``file_lines``, so an input's
lines are read one by one when its batch is checked, and a large file is sent
page by page.
"""

from __future__ import annotations

from collections.abc import Iterable

from sluicegate.batches.backend import PAGE_LINES, Record
from sluicegate.batches.db import Database
from sluicegate.batches.objects import new_id


class FileStore:
    """Create, read, list and delete files of one tenant at a time."""

    def __init__(self, db: Database) -> None:
        self.db = db

    def create(
        self,
        tenant: str,
        purpose: str,
        filename: str,
        size: int,
        lines: Iterable[bytes],
        now: int,
    ) -> Record:
        """Store a file whose content is ``lines`` (without newlines) durably; its row."""
        file_id = new_id("file-")
        with self.db.write() as conn:
            cursor = conn.executemany(
                "INSERT INTO file_lines (file_id, idx, text) VALUES (?, ?, ?)",
                ((file_id, i, text) for i, text in enumerate(lines)),
            )
            count = cursor.rowcount
            conn.execute(
                "INSERT INTO files (id, tenant, purpose, filename, bytes, lines, created_at)"
                " VALUES (?, ?, ?, ?, ?, ?, ?)",
                (file_id, tenant, purpose, filename, size, count, now),
            )
        row = self.get(tenant, file_id)
        assert row is not None
        return row

    def get(self, tenant: str, file_id: str) -> Record | None:
        """The tenant's file ``file_id``; None if there is none (or it is another tenant's)."""
        row = self.db.conn.execute(
            "SELECT * FROM files WHERE id = ? AND tenant = ?", (file_id, tenant)
        ).fetchone()
        return None if row is None else dict(row)

    def listing(
        self, tenant: str, purpose: str | None, after: str | None, limit: int
    ) -> tuple[list[Record], bool]:
        """The tenant's files, newest first, after the file ``after``; and whether more follow."""
        query = "SELECT * FROM files WHERE tenant = ?"
        args: list[object] = [tenant]
        if purpose is not None:
            query += " AND purpose = ?"
            args.append(purpose)
        if after is not None:
            query += " AND seq < COALESCE((SELECT seq FROM files WHERE id = ? AND tenant = ?), -1)"
            args += [after, tenant]
        query += " ORDER BY seq DESC LIMIT ?"
        args.append(limit + 1)
        rows = self.db.conn.execute(query, args).fetchall()
        return [dict(row) for row in rows[:limit]], len(rows) > limit

    def page(self, file_id: str, start: int) -> list[bytes]:
        """Up to ``PAGE_LINES`` lines of a file from line ``start``."""
        rows = self.db.conn.execute(
            "SELECT text FROM file_lines WHERE file_id = ? AND idx >= ? ORDER BY idx LIMIT ?",
            (file_id, start, PAGE_LINES),
        ).fetchall()
        return [bytes(row[0]) for row in rows]

    def delete(self, tenant: str, file_id: str) -> bool:
        """Delete the tenant's file; whether there was one. A batch already checked keeps its
        lines (they were copied), so deleting its input does not stop it."""
        with self.db.write() as conn:
            gone = conn.execute(
                "DELETE FROM files WHERE id = ? AND tenant = ?", (file_id, tenant)
            ).rowcount
            if gone:
                conn.execute("DELETE FROM file_lines WHERE file_id = ?", (file_id,))
        return bool(gone)
