"""How a batch ends: its output and error files written from its results, in one commit.

``in_progress`` with every line done → ``finalizing`` → ``completed``;
``in_progress`` past ``expires_at`` → ``expired``; ``cancelling`` →
``cancelled``. An expired or cancelled batch's unfinished lines become error
lines (``batch_expired``, ``batch_cancelled``), so its files still hold exactly
one line per ``custom_id``; a result that arrives later is ignored.
"""

from __future__ import annotations

import sqlite3

from sluicegate.batches.batch_backend import NewFile
from sluicegate.batches.objects import error_line, new_id
from sluicegate.batches.sqlite.database import Database, insert

ENDINGS = {
    "expired": (
        "expired_at",
        "batch_expired",
        "This request could not be executed before the completion window expired.",
    ),
    "cancelled": ("cancelled_at", "batch_cancelled", "The batch was cancelled."),
}
"""Per way a batch stops: the column of its time, and the error its unfinished lines get."""


class Finisher:
    """Ends the batches that are due; each ending is one committed transaction. Output and
    error files expire ``file_retention_s`` after they are written (None: never)."""

    def __init__(self, db: Database, file_retention_s: int | None = None) -> None:
        self.db = db
        self.file_retention_s = file_retention_s

    def finish_due(self, now: int) -> list[tuple[str, str]]:
        """End every batch that is due now; the ``(batch id, new status)`` of each."""
        conn = self.db.conn
        ended: list[tuple[str, str]] = []
        for (batch_id,) in conn.execute(
            "SELECT id FROM batches WHERE status = 'cancelling'"
        ).fetchall():
            ended += self._stop(batch_id, "cancelling", "cancelled", now)
        # every line answered: completed, even when the window ends in the same breath
        done = conn.execute(
            "SELECT id FROM batches AS b WHERE status = 'finalizing' OR (status = 'in_progress'"
            " AND NOT EXISTS (SELECT 1 FROM lines WHERE batch_id = b.id"
            " AND state IN ('pending', 'running')))"
        ).fetchall()
        for (batch_id,) in done:
            ended += self._complete(batch_id, now)
        for (batch_id,) in conn.execute(
            "SELECT id FROM batches WHERE status = 'in_progress' AND expires_at <= ?", (now,)
        ).fetchall():
            ended += self._stop(batch_id, "in_progress", "expired", now)
        return ended

    def _stop(self, batch_id: str, was: str, status: str, now: int) -> list[tuple[str, str]]:
        column, code, message = ENDINGS[status]
        with self.db.write() as conn:
            if _status(conn, batch_id) != was:
                return []
            answer_unfinished(conn, batch_id, code, message)
            self._write_files(conn, batch_id, now)
            conn.execute(
                f"UPDATE batches SET status = ?, {column} = ? WHERE id = ?", (status, now, batch_id)
            )
        return [(batch_id, status)]

    def _complete(self, batch_id: str, now: int) -> list[tuple[str, str]]:
        with self.db.write() as conn:
            status = _status(conn, batch_id)
            if status == "in_progress":
                conn.execute(
                    "UPDATE batches SET status = 'finalizing', finalizing_at = ? WHERE id = ?",
                    (now, batch_id),
                )
            elif status != "finalizing":  # a crash between the two commits left it so
                return []
        with self.db.write() as conn:
            if _status(conn, batch_id) != "finalizing":
                return []
            self._write_files(conn, batch_id, now)
            conn.execute(
                "UPDATE batches SET status = 'completed', completed_at = ? WHERE id = ?",
                (now, batch_id),
            )
        return [(batch_id, "completed")]

    def _write_files(self, conn: sqlite3.Connection, batch_id: str, now: int) -> None:
        """The output file (answers) and error file (the rest) of a batch, from its results;
        its line rows are dropped."""
        tenant = conn.execute("SELECT tenant FROM batches WHERE id = ?", (batch_id,)).fetchone()[0]
        expires_at = None if self.file_retention_s is None else now + self.file_retention_s
        for ok, column, part in ((1, "output_file_id", "output"), (0, "error_file_id", "errors")):
            file_id = new_id("file-")
            copied = conn.execute(
                "INSERT INTO file_lines (file_id, idx, text)"
                " SELECT ?, ROW_NUMBER() OVER (ORDER BY idx) - 1, text FROM results"
                " WHERE batch_id = ? AND ok = ?",
                (file_id, batch_id, ok),
            ).rowcount
            if copied == 0:
                continue
            size = conn.execute(
                "SELECT SUM(LENGTH(text) + 1) FROM file_lines WHERE file_id = ?", (file_id,)
            ).fetchone()[0]
            made = NewFile(
                tenant=tenant,
                purpose="batch_output",
                filename=f"{batch_id}_{part}.jsonl",
                size=size,
                now=now,
                expires_at=expires_at,
            )
            insert(conn, "files", made.columns(file_id, copied))
            conn.execute(f"UPDATE batches SET {column} = ? WHERE id = ?", (file_id, batch_id))
        # An ended batch's results are all its lines were for: the line rows (copies of the
        # input) go, so the lines table holds only batches still running.
        conn.execute("DELETE FROM lines WHERE batch_id = ?", (batch_id,))


def _status(conn: sqlite3.Connection, batch_id: str) -> str | None:
    row = conn.execute("SELECT status FROM batches WHERE id = ?", (batch_id,)).fetchone()
    return None if row is None else str(row[0])


def answer_unfinished(conn: sqlite3.Connection, batch_id: str, code: str, message: str) -> None:
    """An error line ``code`` as the result of each of the batch's lines that has none yet
    (pending or running), inside the caller's transaction."""
    unfinished = conn.execute(
        "SELECT idx, custom_id FROM lines WHERE batch_id = ? AND state IN ('pending', 'running')",
        (batch_id,),
    ).fetchall()
    conn.executemany(
        "INSERT OR IGNORE INTO results (batch_id, idx, ok, text) VALUES (?, ?, 0, ?)",
        [(batch_id, idx, error_line(custom_id, code, message)) for idx, custom_id in unfinished],
    )
