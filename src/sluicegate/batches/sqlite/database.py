"""The SQLite database behind the batch lane: one file in WAL mode, every commit on disk.

``synchronous=FULL`` makes each commit wait for the write-ahead log to reach the
disk, so whatever the API answered 200 for, or a runner recorded, survives a
``kill -9`` (and a power cut). Several gateway processes (``serve --workers``) open
the same file; writers take turns, waiting up to ``BUSY_TIMEOUT_MS``.

A ``Database`` is used from one thread at a time (the gateway gives it its own).
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
from collections.abc import Iterator, Mapping
from pathlib import Path

BUSY_TIMEOUT_MS = 10_000
SCHEMA_VERSION = 3

_SCHEMA = """
CREATE TABLE IF NOT EXISTS files (
    seq INTEGER PRIMARY KEY,
    id TEXT NOT NULL UNIQUE,
    tenant TEXT NOT NULL,
    purpose TEXT NOT NULL,
    filename TEXT NOT NULL,
    bytes INTEGER NOT NULL,
    lines INTEGER NOT NULL,
    created_at INTEGER NOT NULL,
    expires_at INTEGER
);
CREATE TABLE IF NOT EXISTS file_lines (
    file_id TEXT NOT NULL,
    idx INTEGER NOT NULL,
    text BLOB NOT NULL,
    PRIMARY KEY (file_id, idx)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS batches (
    seq INTEGER PRIMARY KEY,
    id TEXT NOT NULL UNIQUE,
    tenant TEXT NOT NULL,
    endpoint TEXT NOT NULL,
    input_file_id TEXT NOT NULL,
    completion_window TEXT NOT NULL,
    lane TEXT NOT NULL,
    status TEXT NOT NULL,
    metadata TEXT,
    errors TEXT,
    total INTEGER NOT NULL DEFAULT 0,
    output_file_id TEXT,
    error_file_id TEXT,
    created_at INTEGER NOT NULL,
    expires_at INTEGER NOT NULL,
    in_progress_at INTEGER,
    finalizing_at INTEGER,
    completed_at INTEGER,
    failed_at INTEGER,
    expired_at INTEGER,
    cancelling_at INTEGER,
    cancelled_at INTEGER
);
CREATE INDEX IF NOT EXISTS batches_by_tenant ON batches (tenant, seq);
CREATE INDEX IF NOT EXISTS batches_by_status ON batches (status);
CREATE TABLE IF NOT EXISTS lines (
    batch_id TEXT NOT NULL,
    idx INTEGER NOT NULL,
    custom_id TEXT NOT NULL,
    model TEXT NOT NULL,
    body BLOB NOT NULL,
    state TEXT NOT NULL DEFAULT 'pending',
    owner TEXT,
    lease_until REAL NOT NULL DEFAULT 0,
    not_before REAL NOT NULL DEFAULT 0,
    attempts INTEGER NOT NULL DEFAULT 0,
    preemptions INTEGER NOT NULL DEFAULT 0,
    batch_seq INTEGER NOT NULL DEFAULT 0,
    tenant TEXT NOT NULL DEFAULT '',
    PRIMARY KEY (batch_id, idx)
);
CREATE INDEX IF NOT EXISTS lines_owned ON lines (owner) WHERE owner IS NOT NULL;
CREATE TABLE IF NOT EXISTS results (
    batch_id TEXT NOT NULL,
    idx INTEGER NOT NULL,
    ok INTEGER NOT NULL,
    text BLOB NOT NULL,
    prompt_tokens INTEGER NOT NULL DEFAULT 0,
    completion_tokens INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (batch_id, idx)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS uploads (
    file_id TEXT PRIMARY KEY,
    tenant TEXT NOT NULL,
    bytes INTEGER NOT NULL,
    started_at INTEGER NOT NULL
) WITHOUT ROWID;
"""
_SCHEMA_2 = """
CREATE INDEX IF NOT EXISTS files_by_tenant ON files (tenant, seq);
CREATE INDEX IF NOT EXISTS files_by_expiry ON files (expires_at) WHERE expires_at IS NOT NULL;
CREATE INDEX IF NOT EXISTS uploads_by_tenant ON uploads (tenant);
"""
"""Version 2 (quotas and expiry): ``files.expires_at``, ``uploads`` (an upload's quota,
reserved while its lines are written in steps), and the indexes that find a tenant's
files and expired ones."""
_SCHEMA_3 = """
DROP INDEX IF EXISTS lines_to_run;
CREATE INDEX IF NOT EXISTS lines_in_turn ON lines (model, state, tenant, batch_seq, idx);
CREATE TABLE IF NOT EXISTS tenant_turns (
    model TEXT PRIMARY KEY,
    tenant TEXT NOT NULL
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS batch_turns (
    model TEXT NOT NULL,
    tenant TEXT NOT NULL,
    batch_seq INTEGER NOT NULL,
    PRIMARY KEY (model, tenant)
) WITHOUT ROWID;
"""
"""Version 3 (claims in turn across tenants, ``sqlite/line_turns.py``): each line names its
batch's tenant, the index claims walk is by tenant then batch, and where each model's
rotation stands."""


class Database:
    """A connection to the batch database at ``path``, created (with its schema) if new."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        if self.path.parent and not self.path.parent.exists():
            raise FileNotFoundError(f"batches.path: directory {self.path.parent} does not exist")
        private_file(self.path)
        self.conn = _connect(str(self.path))
        mode = self.conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
        if mode != "wal":
            raise OSError(f"batches.path: {self.path} cannot use SQLite's WAL mode ({mode})")
        self.conn.execute("PRAGMA synchronous = FULL")
        self.conn.execute("PRAGMA foreign_keys = OFF")
        with self.write():
            version = self.conn.execute("PRAGMA user_version").fetchone()[0]
            if version > SCHEMA_VERSION:
                raise OSError(
                    f"batches.path: {self.path} was written by a newer sluicegate "
                    f"(schema {version}, this one knows {SCHEMA_VERSION})"
                )
            # executescript() would commit first; one statement at a time stays in the transaction.
            for statement in _SCHEMA.split(";"):
                if statement.strip():
                    self.conn.execute(statement)
            if version == 1:
                self.conn.execute("ALTER TABLE files ADD COLUMN expires_at INTEGER")
            lines = {row[1] for row in self.conn.execute("PRAGMA table_info(lines)")}
            if "tenant" not in lines:
                self.conn.execute("ALTER TABLE lines ADD COLUMN tenant TEXT NOT NULL DEFAULT ''")
                self.conn.execute(
                    "UPDATE lines SET tenant = COALESCE("
                    "(SELECT tenant FROM batches WHERE batches.id = lines.batch_id), '')"
                )
            for statement in (_SCHEMA_2 + _SCHEMA_3).split(";"):
                if statement.strip():
                    self.conn.execute(statement)
            if version != SCHEMA_VERSION:
                # Only when it changes: a database that is up to date opens without a write, so
                # a gateway restarting on a full disk still starts (writes answer 507 until
                # there is room).
                self.conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")

    @contextlib.contextmanager
    def write(self) -> Iterator[sqlite3.Connection]:
        """One write transaction: committed (on disk) when the block ends, rolled back on error."""
        conn = self.conn
        conn.execute("BEGIN IMMEDIATE")
        try:
            yield conn
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")

    def close(self) -> None:
        """Close the connection (a checkpoint folds the log into the database file)."""
        self.conn.close()


class Reader(Database):
    """A read-only connection to the batch database ``db`` opened: with the log (WAL), its
    reads see every committed write and never wait for one in progress, nor for the disk
    (SQLite refuses its ``write``)."""

    def __init__(self, db: Database) -> None:  # no super(): the file is open already
        self.path = db.path
        self.conn = _connect(f"{db.path.resolve().as_uri()}?mode=ro", uri=True)


def _connect(target: str, *, uri: bool = False) -> sqlite3.Connection:
    """A connection usable from any one thread at a time, rows by name, waiting up to
    ``BUSY_TIMEOUT_MS`` for another writer; transactions only where opened explicitly
    (``BEGIN IMMEDIATE``)."""
    conn = sqlite3.connect(
        target,
        uri=uri,
        isolation_level=None,
        check_same_thread=False,
        timeout=BUSY_TIMEOUT_MS / 1000,
    )
    conn.row_factory = sqlite3.Row
    conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
    return conn


def insert(conn: sqlite3.Connection, table: str, row: Mapping[str, object]) -> None:
    """Insert ``row`` (column → value) into ``table``, inside the caller's transaction."""
    names = ", ".join(row)
    marks = ", ".join("?" * len(row))
    conn.execute(f"INSERT INTO {table} ({names}) VALUES ({marks})", tuple(row.values()))


class Rows:
    """One part of the batch database's calls (files, batches, lines, the admin's): its
    methods run on ``db``."""

    def __init__(self, db: Database) -> None:
        self.db = db


PRIVATE_MODE = 0o600
"""The database holds every tenant's prompts and answers: its owner's alone."""


def private_file(path: Path) -> None:
    """Create ``path`` mode 0600 before SQLite opens it (SQLite gives its ``-wal`` and
    ``-shm`` files the database file's mode), and take group and other access away from
    a database, and its log files, made by an older version."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, PRIVATE_MODE)
    try:
        if os.fstat(fd).st_mode & 0o077:
            os.fchmod(fd, PRIVATE_MODE)
    finally:
        os.close(fd)
    for suffix in ("-wal", "-shm"):
        with contextlib.suppress(FileNotFoundError):
            side = path.with_name(path.name + suffix)
            if side.stat().st_mode & 0o077:
                side.chmod(PRIVATE_MODE)
