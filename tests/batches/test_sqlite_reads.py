"""A client's read of the SQLite batch backend never waits for a write.

Writes take turns on the backend's one writer thread, and a commit there can wait for
the disk (``synchronous=FULL``) or for another process's write lock. CI once showed a
``GET /v1/batches`` waiting 0.5 s behind an upload's commit; reads now run on their own
thread with a read-only connection. Here the writer thread is held on purpose: a second
connection takes the write lock, so the backend's next write waits on it.
"""

from __future__ import annotations

import asyncio
import sqlite3
import time
from pathlib import Path

from sluicegate.batches.sqlite.sqlite_batches import SqliteBatches
from tests.batches.conftest import content, file_of, line, new_batch

HOLD_S = 1.0


async def test_reads_answer_while_the_writer_waits_for_a_lock(tmp_path: Path) -> None:
    """With the write lock held elsewhere for ``HOLD_S`` and an upload waiting on it on the
    writer thread, a batch, a listing of files and batches and a page of a file are all
    answered in under a fifth of the hold; the upload then completes."""
    path = tmp_path / "b.db"
    backend = SqliteBatches(str(path))
    await backend.open()
    try:
        batch_id = await new_batch(backend, [line("c0"), line("c1")])
        batch = await backend.get_batch("t1", batch_id)
        assert batch is not None
        holder = sqlite3.connect(path, isolation_level=None)
        holder.execute("BEGIN IMMEDIATE")
        upload = asyncio.create_task(backend.create_file(file_of("t2", "x.jsonl", 50), [line("x")]))
        await asyncio.sleep(0.05)  # the upload's reservation now waits for the lock
        assert not upload.done()
        start = time.perf_counter()
        assert (await backend.get_batch("t1", batch_id) or {}).get("id") == batch_id
        batches, more = await backend.list_batches("t1", None, 10)
        assert ([b["id"] for b in batches], more) == ([batch_id], False)
        files, _ = await backend.list_files("t1", None, None, 10)
        assert [f["id"] for f in files] == [batch["input_file_id"]]
        assert len(await content(backend, str(batch["input_file_id"]))) == 2
        took = time.perf_counter() - start
        assert took < HOLD_S / 5, f"reads took {took:.3f} s behind a held write"
        await asyncio.sleep(HOLD_S - 0.05)
        assert not upload.done()
        holder.execute("COMMIT")
        holder.close()
        stored = await asyncio.wait_for(upload, 5)
        assert (await backend.get_file("t2", str(stored["id"])) or {}).get("id") == stored["id"]
    finally:
        await backend.close()
