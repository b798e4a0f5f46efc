"""What the batch lane keeps durably, as one async interface with two implementations.

``SqliteBatches`` (``sqlite/sqlite_batches.py``) keeps it in one SQLite file: the
embedded default, shared by the workers of one ``serve --workers`` gateway.
``RedisBatches`` (``redis/redis_batches.py``) keeps it in the shared store of
distributed mode, so any replica serves any batch and runs any line. Both pass
``tests/batches/test_backend_conformance.py``.

Every method that changes something returns only once the change is durable
(committed to disk, or acknowledged by the store).

Each tenant's data is bounded (``Quota``, checked atomically where it is stored, so two
uploads at once cannot both take the last byte) and ends: a file at its ``expires_at``,
a batch ``batch_retention_s`` after it is over (``sweep``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import orjson

from sluicegate.batches.lines import LineError, LineRequest
from sluicegate.errors import SluicegateError

Record = dict[str, Any]
"""A file or batch as stored: the columns ``objects.file_object``/``batch_object`` read."""

LineReader = Callable[[str, str, bytes], LineRequest | LineError]
"""Checks one input line of a batch: ``(endpoint, lane, text) → request or error``."""

PAGE_LINES = 2000
"""Lines ``file_page`` returns at most."""
MAX_REPORTED_ERRORS = 100
"""Problems listed in a failed batch's ``errors`` at most."""
UPLOAD_CHUNK_LINES = 1000
UPLOAD_CHUNK_BYTES = 1024 * 1024
"""An upload is written in steps of at most this many lines or bytes (plus one line), so
other calls go between them."""
UPLOAD_TTL_S = 86_400
"""An upload whose process died before it finished is deleted (its quota freed) after this."""
TERMINAL = ("completed", "failed", "expired", "cancelled")
"""Statuses of a batch that is over."""


def take_chunk(lines: Iterator[bytes]) -> list[bytes]:
    """The next step of an upload: up to ``UPLOAD_CHUNK_LINES`` lines, stopping after the
    line that reaches ``UPLOAD_CHUNK_BYTES``; empty at the end."""
    chunk: list[bytes] = []
    size = 0
    for text in lines:
        chunk.append(text)
        size += len(text)
        if len(chunk) >= UPLOAD_CHUNK_LINES or size >= UPLOAD_CHUNK_BYTES:
            break
    return chunk


@dataclass(frozen=True, slots=True)
class Quota:
    """What one tenant may keep (None: no limit): bytes of its files (uploads and the output
    and error files of its batches), files, and batches not yet over."""

    max_bytes: int | None = None
    max_files: int | None = None
    max_active_batches: int | None = None


NO_QUOTA = Quota()


class QuotaExceededError(SluicegateError):
    """A tenant's upload or batch would pass its ``Quota``: nothing was stored.

    ``kind``: ``bytes``, ``files`` or ``active_batches``; ``limit`` the quota;
    ``retry_at``: the wall-clock time its earliest file expires (``bytes``, ``files``) or its
    earliest active batch's window ends (``active_batches``), None if unknown.
    """

    def __init__(self, kind: str, limit: int, retry_at: float | None) -> None:
        super().__init__(f"{kind} quota of {limit} reached")
        self.kind = kind
        self.limit = limit
        self.retry_at = retry_at


@dataclass(frozen=True, slots=True, kw_only=True)
class NewFile:
    """A file to store: the tenant's, for ``purpose``, named ``filename``, of ``size`` bytes
    (its lines and their newlines), stored at ``now`` and gone at ``expires_at`` (None:
    kept)."""

    tenant: str
    purpose: str
    filename: str
    size: int
    now: int
    expires_at: int | None = None

    def columns(self, file_id: str, lines: int) -> Record:
        """Its stored columns as the file ``file_id`` of ``lines`` lines."""
        return {
            "id": file_id,
            "tenant": self.tenant,
            "purpose": self.purpose,
            "filename": self.filename,
            "bytes": self.size,
            "lines": lines,
            "created_at": self.now,
            "expires_at": self.expires_at,
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class NewBatch:
    """A batch a tenant asks for: over its file ``input_file_id``, for ``endpoint``, run in
    ``lane``, within ``window`` (as asked, such as ``24h``; ``window_s`` in seconds), with
    the tenant's ``metadata``; asked at ``now``."""

    tenant: str
    input_file_id: str
    endpoint: str
    window: str
    window_s: int
    lane: str
    metadata: dict[str, str] | None
    now: int

    def columns(self, batch_id: str) -> Record:
        """Its stored columns as the new ``validating`` batch ``batch_id`` (those both
        backends write when it is created; the others start empty)."""
        return {
            "id": batch_id,
            "tenant": self.tenant,
            "endpoint": self.endpoint,
            "input_file_id": self.input_file_id,
            "completion_window": self.window,
            "lane": self.lane,
            "status": "validating",
            "metadata": None if self.metadata is None else orjson.dumps(self.metadata).decode(),
            "created_at": self.now,
            "expires_at": self.now + self.window_s,
        }


@dataclass(frozen=True, slots=True)
class Swept:
    """What one ``sweep`` step deleted: expired files, batches past their retention, and
    uploads abandoned by a process that died."""

    files: int = 0
    batches: int = 0
    uploads: int = 0

    @property
    def total(self) -> int:
        """Everything deleted."""
        return self.files + self.batches + self.uploads


@dataclass(frozen=True, slots=True)
class Claim:
    """A line this process now runs, until its lease ends (``token``: the backend's handle)."""

    batch_id: str
    idx: int
    custom_id: str
    model: str
    body: bytes
    attempts: int
    token: str = ""


@dataclass(frozen=True, slots=True)
class Result:
    """A line's answer: a line of the output file (``ok``) or of the error file, and the
    tokens it used."""

    batch_id: str
    idx: int
    ok: bool
    text: bytes
    prompt_tokens: int = 0
    completion_tokens: int = 0


@dataclass(frozen=True, slots=True)
class Retry:
    """A claimed line going back to wait until ``not_before`` (a wall-clock time).

    ``failed``: an engine failure, counted towards ``max_attempts``; otherwise the line was
    preempted or refused for now (rate limit, full queue), which costs it no attempt.
    """

    claim: Claim
    not_before: float
    failed: bool


@dataclass(frozen=True, slots=True)
class Counts:
    """A batch's progress: lines answered well and not, and the tokens used."""

    completed: int = 0
    failed: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0


Progress = tuple[dict[tuple[str, str], int], dict[str, int]]
"""Lines of unfinished batches per ``(model, state)`` (queued, running, completed, failed),
and batches per status."""


class BatchBackend(Protocol):
    """Files, batches, lines and results, durably."""

    async def open(self) -> None:
        """Connect (create what is missing)."""

    async def close(self) -> None:
        """Disconnect."""

    async def create_file(
        self, file: NewFile, lines: Iterable[bytes], *, quota: Quota = NO_QUOTA
    ) -> Record:
        """Store ``file``, whose content is ``lines`` (without newlines).

        Its ``size`` is reserved against the tenant's quota before a line is stored
        (``QuotaExceededError`` if it does not fit); the lines are written in steps, so other
        calls go between them. An exception raised by ``lines`` stores nothing, frees the
        reservation and propagates."""

    async def get_file(self, tenant: str, file_id: str) -> Record | None:
        """The tenant's file; None if none (or another tenant's)."""

    async def list_files(
        self, tenant: str, purpose: str | None, after: str | None, limit: int
    ) -> tuple[list[Record], bool]:
        """The tenant's files newest first, after the file ``after``; whether more follow."""

    async def file_page(self, file_id: str, start: int) -> list[bytes]:
        """Up to ``PAGE_LINES`` lines of a file from line ``start``."""

    async def delete_file(self, tenant: str, file_id: str) -> bool:
        """Delete the tenant's file; whether there was one."""

    async def create_batch(self, batch: NewBatch, *, quota: Quota = NO_QUOTA) -> Record:
        """``batch``, stored as a new ``validating`` batch (``QuotaExceededError`` if the tenant has
        ``quota.max_active_batches`` batches not yet over)."""

    async def get_batch(self, tenant: str, batch_id: str) -> Record | None:
        """The tenant's batch; None if none (or another tenant's)."""

    async def list_batches(
        self, tenant: str, after: str | None, limit: int
    ) -> tuple[list[Record], bool]:
        """The tenant's batches newest first, after the batch ``after``; whether more follow."""

    async def cancel_batch(self, tenant: str, batch_id: str, now: int) -> Record | None:
        """``validating``/``in_progress`` → ``cancelling``; others unchanged. None if none."""

    async def batch_counts(self, batch_id: str) -> Counts:
        """A batch's progress so far."""

    async def validate_pending(self, read: LineReader, now: int) -> list[tuple[str, str]]:
        """Check every ``validating`` batch: ``in_progress`` or ``failed``; each new status."""

    async def finish_due(self, now: int) -> list[tuple[str, str]]:
        """End every batch that is due (``batches/sqlite/finishing.py``); each new status."""

    async def claim(
        self, model: str, owner: str, limit: int, now: float, lease_s: float
    ) -> list[Claim]:
        """Up to ``limit`` runnable lines of ``model``, leased to owner: those whose lease ran
        out first, then the others in turn, round-robin across tenants
        (in byte order of their names) and then across each tenant's batches (by age), each
        batch's lines in order; the rotation goes on from where the last claim left it."""

    async def renew(self, owner: str, claims: Sequence[Claim], until: float) -> None:
        """Extend the lease of these lines, which ``owner`` runs."""

    async def record(self, results: Sequence[Result], retries: Sequence[Retry], owner: str) -> None:
        """Store results (the first per line wins) and send retried lines back to wait."""

    async def statuses(self, batch_ids: Sequence[str]) -> dict[str, str]:
        """The status of each of these batches."""

    async def batch_route(self, batch_id: str) -> tuple[str, str, str] | None:
        """(tenant, lane, endpoint) of a batch."""

    async def progress(self) -> Progress:
        """The counts the metrics and ``/admin/state`` show."""

    async def sweep(self, now: int, batch_retention_s: int | None, limit: int) -> Swept:
        """Delete up to ``limit`` of each: files whose ``expires_at`` passed, batches over
        for ``batch_retention_s`` (with their results; their files expire on their own) and
        uploads older than ``UPLOAD_TTL_S`` that never finished; each frees its quota.
        Safe from many processes at once (what another deleted is skipped)."""

    async def admin_batches(
        self, tenant: str | None, after: str | None, limit: int
    ) -> tuple[list[Record], bool]:
        """Every tenant's batches (only ``tenant``'s when given) newest first, after the batch
        ``after``; whether more follow. For the admin: each record names its tenant."""

    async def active_batches(self) -> list[tuple[str, str]]:
        """``(batch id, tenant)`` of every ``validating`` or ``in_progress`` batch."""

    async def stop_batch(self, batch_id: str, code: str, message: str, now: int) -> bool:
        """End a ``validating``/``in_progress`` batch for a reason of the gateway's: each line
        without a result gets an error line ``code``, the batch's ``errors`` name ``code``,
        and it becomes ``cancelling`` (``finish_due`` ends it ``cancelled``). Whether it was
        such a batch."""
