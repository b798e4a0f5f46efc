"""The batch database's files on disk: the database, its ``-wal`` and its ``-shm`` are their
owner's alone (mode 0600), whatever the umask lets through; they hold every tenant's prompts."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from sluicegate.batches.sqlite.database import Database
from tests.batches.batch_harness import batch_stack, chat_line, client, upload

SIDES = ("", "-wal", "-shm")


@pytest.fixture
def open_umask() -> Iterator[None]:
    """The common umask 022, under which a plain create is 0644 (world-readable)."""
    previous = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(previous)


def modes(db: Path) -> dict[str, int]:
    """The permission bits of the database and its log files that exist."""
    found = {}
    for suffix in SIDES:
        path = db.with_name(db.name + suffix)
        if path.exists():
            found[suffix or "db"] = stat.S_IMODE(path.stat().st_mode)
    return found


INSERT_FILE = (
    "INSERT INTO files (id, tenant, purpose, filename, bytes, lines, created_at)"
    " VALUES (?, 'a', 'batch', ?, 1, 1, 0)"
)


@pytest.mark.usefixtures("open_umask")
def test_a_new_database_and_its_log_files_are_0600(tmp_path: Path) -> None:
    """A new database written through: the file, its -wal and -shm all exist, all 0600."""
    db = tmp_path / "batches.db"
    database = Database(db)
    try:
        with database.write() as conn:
            conn.execute(INSERT_FILE, ("file-x", "x.jsonl"))
        assert modes(db) == {"db": 0o600, "-wal": 0o600, "-shm": 0o600}
    finally:
        database.close()


@pytest.mark.usefixtures("open_umask")
def test_an_older_world_readable_database_is_made_private(tmp_path: Path) -> None:
    """A database (and log files) left 0644 by an older version: 0600 once opened, and its
    rows are still there."""
    db = tmp_path / "old.db"
    first = Database(db)
    with first.write() as conn:
        conn.execute(INSERT_FILE, ("file-y", "y.jsonl"))
    for suffix in SIDES:
        os.chmod(db.with_name(db.name + suffix), 0o644)
    try:
        second = Database(db)
        try:
            assert modes(db) == {"db": 0o600, "-wal": 0o600, "-shm": 0o600}
            assert second.conn.execute("SELECT id FROM files").fetchall()[0][0] == "file-y"
        finally:
            second.close()
    finally:
        first.close()


@pytest.mark.usefixtures("open_umask")
def test_the_gateways_database_is_0600_after_an_upload(tmp_path: Path) -> None:
    """A real gateway with the batch lane on: after an upload, the database and its log
    files are 0600."""
    with batch_stack(tmp_path) as live:
        upload(client(live), [chat_line("p0")])
        assert modes(tmp_path / "batches.db") == {"db": 0o600, "-wal": 0o600, "-shm": 0o600}
