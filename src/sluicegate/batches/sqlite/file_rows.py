"""Files in the batch database: uploaded inputs and the output and error files of batches.

A file is a row in ``files`` and its lines in ``file_lines``, so an input's
lines are read one by one when its batch is checked, and a large file is sent
page by page.
"""

from __future__ import annotations

from collections.abc import Iterator

from sluicegate.batches.batch_backend import (
    PAGE_LINES,
    UPLOAD_TTL_S,
    NewFile,
    Quota,
    QuotaExceededError,
    Record,
    take_chunk,
)
from sluicegate.batches.objects import new_id
from sluicegate.batches.sqlite.database import Rows, insert


class FileStore(Rows):
    """Create, read, list and delete files of one tenant at a time.

    An upload takes three kinds of step, each its own transaction: ``reserve`` (the quota
    check and an ``uploads`` row holding the size), ``write`` (one bounded chunk of lines;
    as many as the file needs) and ``commit`` (the ``files`` row; the reservation becomes
    the file). Between steps the thread serves other calls. A failed upload is undone by
    ``abandon``; one whose process died is swept after ``UPLOAD_TTL_S``.
    """

    def reserve(self, file: NewFile, quota: Quota) -> str:
        """A new file id with ``file.size`` bytes and one file reserved against ``quota``;
        ``QuotaExceededError`` (nothing reserved) if they do not fit."""
        file_id = new_id("file-")
        tenant, size = file.tenant, file.size
        with self.db.write() as conn:
            stored_bytes, stored_files = conn.execute(
                "SELECT COALESCE(SUM(bytes), 0), COUNT(*) FROM files WHERE tenant = ?", (tenant,)
            ).fetchone()
            held_bytes, held_files = conn.execute(
                "SELECT COALESCE(SUM(bytes), 0), COUNT(*) FROM uploads WHERE tenant = ?",
                (tenant,),
            ).fetchone()
            over = None
            if quota.max_files is not None and stored_files + held_files + 1 > quota.max_files:
                over = ("files", quota.max_files)
            elif quota.max_bytes is not None and stored_bytes + held_bytes + size > quota.max_bytes:
                over = ("bytes", quota.max_bytes)
            if over is not None:
                soonest = conn.execute(
                    "SELECT MIN(expires_at) FROM files WHERE tenant = ?", (tenant,)
                ).fetchone()[0]
                raise QuotaExceededError(*over, soonest)
            conn.execute(
                "INSERT INTO uploads (file_id, tenant, bytes, started_at) VALUES (?, ?, ?, ?)",
                (file_id, tenant, size, file.now),
            )
        return file_id

    def write(self, file_id: str, lines: Iterator[bytes], start: int) -> int:
        """Store the next lines of an upload from index ``start``, at most
        ``UPLOAD_CHUNK_LINES`` lines or about ``UPLOAD_CHUNK_BYTES``; how many (0: the end)."""
        chunk = take_chunk(lines)
        if chunk:
            with self.db.write() as conn:
                conn.executemany(
                    "INSERT INTO file_lines (file_id, idx, text) VALUES (?, ?, ?)",
                    ((file_id, start + i, text) for i, text in enumerate(chunk)),
                )
        return len(chunk)

    def commit(self, file_id: str, file: NewFile, lines: int) -> Record:
        """The reserved upload, its ``lines`` written, becomes a file; its row."""
        with self.db.write() as conn:
            held = conn.execute("DELETE FROM uploads WHERE file_id = ?", (file_id,)).rowcount
            if not held:
                raise RuntimeError("the upload's reservation was swept before it finished")
            insert(conn, "files", file.columns(file_id, lines))
        row = self.get(file.tenant, file_id)
        assert row is not None
        return row

    def abandon(self, file_id: str) -> None:
        """Undo an upload that did not finish: its lines and its reservation go."""
        with self.db.write() as conn:
            conn.execute("DELETE FROM uploads WHERE file_id = ?", (file_id,))
            conn.execute("DELETE FROM file_lines WHERE file_id = ?", (file_id,))

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

    def sweep(self, now: int, limit: int) -> tuple[int, int]:
        """Delete up to ``limit`` files whose ``expires_at`` passed, and up to ``limit``
        uploads abandoned ``UPLOAD_TTL_S`` ago; how many of each."""
        with self.db.write() as conn:
            files = [
                row[0]
                for row in conn.execute(
                    "SELECT id FROM files WHERE expires_at <= ? LIMIT ?", (now, limit)
                )
            ]
            uploads = [
                row[0]
                for row in conn.execute(
                    "SELECT file_id FROM uploads WHERE started_at <= ? LIMIT ?",
                    (now - UPLOAD_TTL_S, limit),
                )
            ]
            for file_id in files:
                conn.execute("DELETE FROM files WHERE id = ?", (file_id,))
            for file_id in uploads:
                conn.execute("DELETE FROM uploads WHERE file_id = ?", (file_id,))
            conn.executemany(
                "DELETE FROM file_lines WHERE file_id = ?", [(i,) for i in files + uploads]
            )
        return len(files), len(uploads)

    def expire_unexpiring(self, retention_s: int) -> None:
        """Give every file without an expiry (stored before expiry existed, or while
        ``file_retention`` was off) ``created_at + retention_s``."""
        with self.db.write() as conn:
            conn.execute(
                "UPDATE files SET expires_at = created_at + ? WHERE expires_at IS NULL",
                (retention_s,),
            )
