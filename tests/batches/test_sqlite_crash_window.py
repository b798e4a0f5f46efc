"""The SQLite backend finishes a batch a crash left between the two commits of completion.

``batches/sqlite/finishing.py`` completes a batch in two commits (``finalizing``, then the files and
``completed``); a process killed between them leaves the batch ``finalizing`` with no
files. Random kills almost never land in that window (milliseconds), so it is made here
by hand: the first commit's state, written straight into the database file.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import orjson

from sluicegate.batches.sqlite.sqlite_batches import SqliteBatches
from tests.batches.conftest import LEASE_S, NOW, answer, content, line, new_batch, read


async def test_a_batch_left_finalizing_gets_its_files_and_completes(tmp_path: Path) -> None:
    """A batch whose lines are all answered, left ``finalizing`` without files by a crash,
    ends ``completed`` at the next ``finish_due`` of a new process, with one output line per
    input line, in order; a second ``finish_due`` changes nothing."""
    path = tmp_path / "b.db"
    first = SqliteBatches(str(path))
    await first.open()
    batch_id = await new_batch(first, [line(f"c{i}") for i in range(3)])
    await first.validate_pending(read, NOW)
    claims = await first.claim("m1", "A", 10, NOW, LEASE_S)
    await first.record([answer(c) for c in claims], [], "A")
    await first.close()
    with sqlite3.connect(path) as conn:  # the first commit of completion, and then the crash
        conn.execute(
            "UPDATE batches SET status = 'finalizing', finalizing_at = ? WHERE id = ?",
            (NOW + 1, batch_id),
        )

    second = SqliteBatches(str(path))
    await second.open()
    try:
        assert await second.finish_due(NOW + 2) == [(batch_id, "completed")]
        assert await second.finish_due(NOW + 3) == []
        row = await second.get_batch("t1", batch_id)
        assert row is not None
        assert (row["status"], row["finalizing_at"], row["completed_at"]) == (
            "completed",
            NOW + 1,
            NOW + 2,
        )
        out = [orjson.loads(t)["custom_id"] for t in await content(second, row["output_file_id"])]
        assert out == ["c0", "c1", "c2"]
        assert row["error_file_id"] is None
    finally:
        await second.close()
