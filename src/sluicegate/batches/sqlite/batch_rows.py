"""Batches in the batch database as the API sees them: create, read, list, cancel."""

from __future__ import annotations

from sluicegate.batches.batch_backend import (
    TERMINAL,
    Counts,
    NewBatch,
    Quota,
    QuotaExceededError,
    Record,
)
from sluicegate.batches.objects import ACTIVE, new_id
from sluicegate.batches.sqlite.database import Rows, insert

_ACTIVE = ",".join(f"'{status}'" for status in ACTIVE)
_TERMINAL = ",".join(f"'{status}'" for status in TERMINAL)
_ENDED_AT = "COALESCE(completed_at, failed_at, expired_at, cancelled_at)"

COUNTS = (
    "SELECT COALESCE(SUM(ok), 0), COUNT(*) - COALESCE(SUM(ok), 0),"
    " COALESCE(SUM(prompt_tokens), 0), COALESCE(SUM(completion_tokens), 0)"
    " FROM results WHERE batch_id = ?"
)
"""Lines of a batch answered well (completed) and not (failed), and the tokens they used."""


class BatchStore(Rows):
    """The batches of one tenant at a time; every change committed before it returns."""

    def create(self, batch: NewBatch, quota: Quota) -> Record:
        """``batch`` as a new batch, ``validating``: the runner checks its lines next.
        ``QuotaExceededError`` if the tenant already has ``quota.max_active_batches``
        batches not yet over."""
        columns = batch.columns(new_id("batch_"))
        with self.db.write() as conn:
            limit = quota.max_active_batches
            if limit is not None:
                active, soonest = conn.execute(
                    f"SELECT COUNT(*), MIN(expires_at) FROM batches"
                    f" WHERE tenant = ? AND status IN ({_ACTIVE})",
                    (batch.tenant,),
                ).fetchone()
                if active >= limit:
                    raise QuotaExceededError("active_batches", limit, soonest)
            insert(conn, "batches", columns)
        row = self.get(batch.tenant, columns["id"])
        assert row is not None
        return row

    def get(self, tenant: str, batch_id: str) -> Record | None:
        """The tenant's batch ``batch_id``; None if there is none (or it is another tenant's)."""
        row = self.db.conn.execute(
            "SELECT * FROM batches WHERE id = ? AND tenant = ?", (batch_id, tenant)
        ).fetchone()
        return None if row is None else dict(row)

    def counts(self, batch_id: str) -> Counts:
        """A batch's progress so far."""
        row = self.db.conn.execute(COUNTS, (batch_id,)).fetchone()
        return Counts(*(int(value) for value in row))

    def listing(self, tenant: str, after: str | None, limit: int) -> tuple[list[Record], bool]:
        """The tenant's batches, newest first, after the batch ``after``; whether more follow."""
        query = "SELECT * FROM batches WHERE tenant = ?"
        args: list[object] = [tenant]
        if after is not None:
            query += (
                " AND seq < COALESCE((SELECT seq FROM batches WHERE id = ? AND tenant = ?), -1)"
            )
            args += [after, tenant]
        query += " ORDER BY seq DESC LIMIT ?"
        args.append(limit + 1)
        rows = self.db.conn.execute(query, args).fetchall()
        return [dict(row) for row in rows[:limit]], len(rows) > limit

    def cancel(self, tenant: str, batch_id: str, now: int) -> Record | None:
        """Ask for a batch to stop: ``cancelling`` (the runner ends it ``cancelled``). A batch
        already over is left as it is. None if the tenant has no such batch."""
        with self.db.write() as conn:
            conn.execute(
                "UPDATE batches SET status = 'cancelling', cancelling_at = ?"
                " WHERE id = ? AND tenant = ? AND status IN ('validating', 'in_progress')",
                (now, batch_id, tenant),
            )
        return self.get(tenant, batch_id)

    def purge(self, now: int, retention_s: int, limit: int) -> int:
        """Delete up to ``limit`` batches over for ``retention_s``, with their results (their
        output and error files expire on their own); how many."""
        with self.db.write() as conn:
            ids = [
                row[0]
                for row in conn.execute(
                    f"SELECT id FROM batches WHERE status IN ({_TERMINAL})"
                    f" AND {_ENDED_AT} <= ? LIMIT ?",
                    (now - retention_s, limit),
                )
            ]
            for batch_id in ids:
                conn.execute("DELETE FROM results WHERE batch_id = ?", (batch_id,))
                conn.execute("DELETE FROM lines WHERE batch_id = ?", (batch_id,))
                conn.execute("DELETE FROM batches WHERE id = ?", (batch_id,))
        return len(ids)
