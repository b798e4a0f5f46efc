"""The admin's side of the SQLite batch database: every tenant's batches, and stopping one
for a reason of the gateway's (its tenant is no longer configured)."""

from __future__ import annotations

import orjson

from sluicegate.batches.batch_backend import Record
from sluicegate.batches.sqlite.database import Rows
from sluicegate.batches.sqlite.finishing import answer_unfinished


class AdminStore(Rows):
    """Batches of every tenant; each change one committed transaction."""

    def listing(
        self, tenant: str | None, after: str | None, limit: int
    ) -> tuple[list[Record], bool]:
        """Every tenant's batches (or ``tenant``'s) newest first, after the batch ``after``;
        whether more follow."""
        query = "SELECT * FROM batches WHERE 1"
        args: list[object] = []
        if tenant is not None:
            query += " AND tenant = ?"
            args.append(tenant)
        if after is not None:
            query += " AND seq < COALESCE((SELECT seq FROM batches WHERE id = ?), -1)"
            args.append(after)
        query += " ORDER BY seq DESC LIMIT ?"
        args.append(limit + 1)
        rows = self.db.conn.execute(query, args).fetchall()
        return [dict(row) for row in rows[:limit]], len(rows) > limit

    def active(self) -> list[tuple[str, str]]:
        """``(id, tenant)`` of every ``validating`` or ``in_progress`` batch."""
        rows = self.db.conn.execute(
            "SELECT id, tenant FROM batches WHERE status IN ('validating', 'in_progress')"
            " ORDER BY seq"
        ).fetchall()
        return [(row[0], row[1]) for row in rows]

    def stop(self, batch_id: str, code: str, message: str, now: int) -> bool:
        """Error lines ``code`` for the batch's unfinished lines, which no longer run, and
        the batch ``cancelling`` with ``code`` in its errors, in one transaction."""
        with self.db.write() as conn:
            row = conn.execute("SELECT status FROM batches WHERE id = ?", (batch_id,)).fetchone()
            if row is None or row[0] not in ("validating", "in_progress"):
                return False
            answer_unfinished(conn, batch_id, code, message)
            conn.execute(
                "UPDATE lines SET state = 'failed', owner = NULL"
                " WHERE batch_id = ? AND state IN ('pending', 'running')",
                (batch_id,),
            )
            errors = [{"code": code, "message": message, "line": None, "param": None}]
            conn.execute(
                "UPDATE batches SET status = 'cancelling', cancelling_at = ?, errors = ?"
                " WHERE id = ?",
                (now, orjson.dumps(errors).decode(), batch_id),
            )
        return True
