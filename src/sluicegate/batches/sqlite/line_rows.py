"""The runner's side of the batch database: check a batch's lines, claim them, record results.

A line is ``pending``, ``running`` (claimed by one gateway process until
``lease_until``, which that process renews), or ``completed``/``failed`` (its
result is in ``results``); the rows of a batch go when it ends. A claim whose
lease ran out, because its process died, is claimable again: the line runs
again, and ``results`` keeps the first answer recorded for it (``INSERT OR
IGNORE`` on the line's key), so every line has exactly one.
"""

from __future__ import annotations

from collections.abc import Sequence

import orjson

from sluicegate.batches.batch_backend import MAX_REPORTED_ERRORS, Claim, LineReader, Result, Retry
from sluicegate.batches.lines import LineError
from sluicegate.batches.objects import error_line
from sluicegate.batches.sqlite.database import Rows
from sluicegate.batches.sqlite.line_turns import Turns

_STALE = (
    "SELECT l.rowid FROM lines AS l JOIN batches AS b ON b.id = l.batch_id"
    " WHERE l.model = ? AND l.state = 'running' AND l.lease_until < ?"
    " AND b.status = 'in_progress' ORDER BY l.batch_seq, l.idx LIMIT ?"
)
_TAKE = (
    "UPDATE lines SET state = 'running', owner = ?, lease_until = ? WHERE rowid = ?"
    " RETURNING batch_id, idx, custom_id, model, body, attempts"
)


class LineStore(Rows):
    """Lines and results of every batch; each method is one committed transaction."""

    def validate(self, batch_id: str, read: LineReader, now: int) -> str | None:
        """Check a ``validating`` batch's input: its lines become ``pending`` (bad ones error
        lines) and the batch ``in_progress``; or the batch ``failed`` (no line can run, a
        repeated ``custom_id``, the input is gone). The new status, or None if the batch was
        not validating."""
        conn = self.db.conn
        with self.db.write():
            batch = conn.execute(
                "SELECT seq, tenant, endpoint, lane, input_file_id, status FROM batches"
                " WHERE id = ?",
                (batch_id,),
            ).fetchone()
            if batch is None or batch["status"] != "validating":
                return None
            rows = conn.execute(
                "SELECT text FROM file_lines WHERE file_id = ? ORDER BY idx",
                (batch["input_file_id"],),
            )
            runnable: list[tuple[str, int, str, str, bytes]] = []
            errors: list[tuple[str, int, int, bytes]] = []
            problems: list[dict[str, object]] = []
            seen: set[str] = set()
            total = 0
            for idx, (text,) in enumerate(rows):
                total += 1
                line = read(batch["endpoint"], batch["lane"], bytes(text))
                # a custom_id names one line of one file, malformed or not
                if line.custom_id is not None and line.custom_id in seen:
                    return self._fail(
                        batch_id,
                        "duplicate_custom_id",
                        f"custom_id {line.custom_id!r} appears more than once",
                        idx + 1,
                        now,
                    )
                if line.custom_id is not None:
                    seen.add(line.custom_id)
                if isinstance(line, LineError):
                    errors.append(
                        (batch_id, idx, 0, error_line(line.custom_id, line.code, line.message))
                    )
                    if len(problems) < MAX_REPORTED_ERRORS:
                        problems.append(
                            {
                                "code": line.code,
                                "message": line.message,
                                "line": idx + 1,
                                "param": None,
                            }
                        )
                    continue
                runnable.append((batch_id, idx, line.custom_id, line.model, line.body))
            if total == 0:
                return self._fail(
                    batch_id, "empty_file", "the input file is gone or has no lines", None, now
                )
            if not runnable:
                return self._fail_many(batch_id, problems, now)
            conn.executemany(
                "INSERT INTO lines (batch_id, idx, custom_id, model, body, batch_seq, tenant)"
                " VALUES (?, ?, ?, ?, ?, ?, ?)",
                [(*row, batch["seq"], batch["tenant"]) for row in runnable],
            )
            conn.executemany(
                "INSERT INTO results (batch_id, idx, ok, text) VALUES (?, ?, ?, ?)", errors
            )
            conn.execute(
                "UPDATE batches SET status = 'in_progress', in_progress_at = ?, total = ?"
                " WHERE id = ?",
                (now, total, batch_id),
            )
        return "in_progress"

    def _fail(self, batch_id: str, code: str, message: str, line: int | None, now: int) -> str:
        return self._fail_many(
            batch_id, [{"code": code, "message": message, "line": line, "param": None}], now
        )

    def _fail_many(self, batch_id: str, problems: list[dict[str, object]], now: int) -> str:
        self.db.conn.execute(
            "UPDATE batches SET status = 'failed', failed_at = ?, errors = ? WHERE id = ?",
            (now, orjson.dumps(problems).decode(), batch_id),
        )
        return "failed"

    def claim(self, model: str, owner: str, limit: int, now: float, lease_s: float) -> list[Claim]:
        """Up to ``limit`` runnable lines of ``model``, now this owner's: first lines whose
        lease ran out (their process died), oldest batch first; then pending ones in turn,
        round-robin across tenants, then across each tenant's batches (``line_turns``).
        """
        until = now + lease_s
        with self.db.write() as conn:
            stale = [row[0] for row in conn.execute(_STALE, (model, now, limit))]
            rows = [conn.execute(_TAKE, (owner, until, rowid)).fetchone() for rowid in stale]
            turns = Turns(conn, model, now)
            while len(rows) < limit and (rowids := turns.next_lines(limit - len(rows))):
                rows += [conn.execute(_TAKE, (owner, until, rowid)).fetchone() for rowid in rowids]
            turns.save()
        return [Claim(r[0], r[1], r[2], r[3], bytes(r[4]), r[5]) for r in rows]

    def renew(self, owner: str, until: float) -> None:
        """Extend the lease of every line this owner runs (one statement for all of them)."""
        with self.db.write() as conn:
            conn.execute(
                "UPDATE lines SET lease_until = ? WHERE owner = ? AND state = 'running'",
                (until, owner),
            )

    def record(self, results: Sequence[Result], retries: Sequence[Retry], owner: str) -> None:
        """Store finished lines (the first result of a line wins) and send others back to
        ``pending``, in one transaction."""
        with self.db.write() as conn:
            conn.executemany(
                "INSERT OR IGNORE INTO results"
                " (batch_id, idx, ok, text, prompt_tokens, completion_tokens)"
                " VALUES (?, ?, ?, ?, ?, ?)",
                [
                    (r.batch_id, r.idx, int(r.ok), r.text, r.prompt_tokens, r.completion_tokens)
                    for r in results
                ],
            )
            conn.executemany(
                "UPDATE lines SET state = ?, owner = NULL"
                " WHERE batch_id = ? AND idx = ? AND state IN ('pending', 'running')",
                [("completed" if r.ok else "failed", r.batch_id, r.idx) for r in results],
            )
            conn.executemany(
                "UPDATE lines SET state = 'pending', owner = NULL, not_before = ?,"
                " attempts = attempts + ?, preemptions = preemptions + ?"
                " WHERE batch_id = ? AND idx = ? AND state = 'running' AND owner = ?",
                [
                    (
                        r.not_before,
                        int(r.failed),
                        int(not r.failed),
                        r.claim.batch_id,
                        r.claim.idx,
                        owner,
                    )
                    for r in retries
                ],
            )

    def batch_ids(self, status: str) -> list[str]:
        """Ids of every batch in ``status``, oldest first."""
        rows = self.db.conn.execute(
            "SELECT id FROM batches WHERE status = ? ORDER BY seq", (status,)
        ).fetchall()
        return [row[0] for row in rows]

    def statuses(self, batch_ids: Sequence[str]) -> dict[str, str]:
        """The status of each of these batches."""
        marks = ",".join("?" * len(batch_ids))
        rows = self.db.conn.execute(
            f"SELECT id, status FROM batches WHERE id IN ({marks})", list(batch_ids)
        ).fetchall()
        return {row[0]: row[1] for row in rows}

    def batch_route(self, batch_id: str) -> tuple[str, str, str] | None:
        """(tenant, lane, endpoint) of a batch."""
        row = self.db.conn.execute(
            "SELECT tenant, lane, endpoint FROM batches WHERE id = ?", (batch_id,)
        ).fetchone()
        return None if row is None else (row[0], row[1], row[2])

    def progress(self) -> tuple[dict[tuple[str, str], int], dict[str, int]]:
        """Lines of unfinished batches per ``(model, state)`` (``queued``, ``running``,
        ``completed``, ``failed``), and batches per status. Only unfinished batches have
        line rows, so this counts the ``lines_in_turn`` index alone."""
        lines = self.db.conn.execute(
            "SELECT model, CASE state WHEN 'pending' THEN 'queued' ELSE state END, COUNT(*)"
            " FROM lines GROUP BY model, state"
        ).fetchall()
        batches = self.db.conn.execute(
            "SELECT status, COUNT(*) FROM batches GROUP BY status"
        ).fetchall()
        return {(r[0], r[1]): r[2] for r in lines}, {r[0]: r[1] for r in batches}
