"""Whose turn it is to have a line claimed: round-robin across tenants, then across each
tenant's batches.

A claim takes pending lines one at a time: from the tenant after the one served last
(tenants in byte order of their names, wrapping around) that has a line it can run now,
from that tenant's batch after the one it was last served from (batches by age, wrapping
around), that batch's first line. So a tenant's 10-line batch waits at most one turn
behind another tenant's 50,000 lines, whatever their ages. Where each model's rotation
stands is kept (``tenant_turns``, ``batch_turns``), so it goes on across claims,
processes and restarts.

Each step is a seek or two in the ``lines_in_turn`` index (model, state, tenant, batch,
line): a claim costs the lines it takes (plus retried lines still waiting), not the
number waiting. Redis keeps the same order (``batches/redis/scripts/claim.lua``).
"""

from __future__ import annotations

import sqlite3

_FIRST = (
    "SELECT l.rowid, l.tenant, l.batch_seq FROM lines AS l JOIN batches AS b ON b.id = l.batch_id"
    " WHERE l.model = ? AND l.state = 'pending' AND l.not_before <= ?"
    " AND b.status = 'in_progress' AND {where} ORDER BY l.tenant, l.batch_seq, l.idx LIMIT ?"
)


class Turns:
    """The rotation of ``model``'s claims at ``now``, inside the claim's transaction."""

    def __init__(self, conn: sqlite3.Connection, model: str, now: float) -> None:
        self.conn = conn
        self.model = model
        self.now = now
        row = conn.execute("SELECT tenant FROM tenant_turns WHERE model = ?", (model,)).fetchone()
        self.tenant: str | None = None if row is None else str(row[0])
        """The tenant served last."""
        self._last: dict[str, int | None] = {}
        self._served: dict[str, int] = {}
        self._empty: set[tuple[str, tuple[object, ...]]] = set()

    def _first(self, where: str, *args: object) -> tuple[int, str, int] | None:
        # A search that found nothing is not asked again: a claim only takes lines.
        if (where, args) in self._empty:
            return None
        row = self.conn.execute(
            _FIRST.format(where=where), (self.model, self.now, *args, 1)
        ).fetchone()
        if row is None:
            self._empty.add((where, args))
            return None
        return int(row[0]), str(row[1]), int(row[2])

    def _last_batch(self, tenant: str) -> int | None:
        if tenant not in self._last:
            row = self.conn.execute(
                "SELECT batch_seq FROM batch_turns WHERE model = ? AND tenant = ?",
                (self.model, tenant),
            ).fetchone()
            self._last[tenant] = None if row is None else int(row[0])
        return self._last[tenant]

    def next_lines(self, room: int) -> list[int]:
        """The rowids of the next pending lines to claim (the caller marks them running
        before asking again): the next turn's line; or, when one batch of one tenant is all
        that can run, up to ``room`` of its lines, as that many turns would give; none if no
        line of the model can run now."""
        after = None if self.tenant is None else self._first("l.tenant > ?", self.tenant)
        first = after or self._first("1")
        if first is None:
            return []
        rowid, tenant, seq = first
        last = self._last_batch(tenant)
        if last is not None and seq <= last:
            # ``first`` is the tenant's oldest batch: its next one, if any, comes before it
            later = self._first("l.tenant = ? AND l.batch_seq > ?", tenant, last)
            if later is not None:
                rowid, _, seq = later
        self.tenant = tenant
        self._last[tenant] = self._served[tenant] = seq
        alone = (
            room > 1
            and after is None  # no tenant before this one (``first`` came from the start)
            and seq == first[2]
            and self._first("l.tenant > ?", tenant) is None
            and self._first("l.tenant = ? AND l.batch_seq > ?", tenant, seq) is None
        )
        if not alone:
            return [rowid]
        where = "l.tenant = ? AND l.batch_seq = ?"
        rows = self.conn.execute(
            _FIRST.format(where=where), (self.model, self.now, tenant, seq, room)
        )
        return [int(row[0]) for row in rows]

    def save(self) -> None:
        """Keep where the rotation stands (nothing if no line was taken)."""
        if self.tenant is None or not self._served:
            return
        self.conn.execute(
            "INSERT INTO tenant_turns (model, tenant) VALUES (?, ?)"
            " ON CONFLICT (model) DO UPDATE SET tenant = excluded.tenant",
            (self.model, self.tenant),
        )
        self.conn.executemany(
            "INSERT INTO batch_turns (model, tenant, batch_seq) VALUES (?, ?, ?)"
            " ON CONFLICT (model, tenant) DO UPDATE SET batch_seq = excluded.batch_seq",
            [(self.model, tenant, seq) for tenant, seq in self._served.items()],
        )
