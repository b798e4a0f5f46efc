"""What the batch lane keeps durably, as one async interface with two implementations.

``SqliteBatches`` (``sqlite_backend.py``) keeps it in one SQLite file: the
embedded default, shared by the workers of one ``serve --workers`` gateway.
``RedisBatches`` (``redis_backend.py``) keeps it in the shared store of
distributed mode, so any replica serves any batch and runs any line. Both pass
``tests/batches/test_backend_conformance.py``.

Every method that changes something returns only once the change is durable
(committed to disk, or acknowledged by the store).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from sluicegate.batches.lines import LineError, LineRequest

Record = dict[str, Any]
"""A file or batch as stored: the columns ``objects.file_object``/``batch_object`` read."""

LineReader = Callable[[str, str, bytes], LineRequest | LineError]
"""Checks one input line of a batch: ``(endpoint, lane, text) → request or error``."""

PAGE_LINES = 2000
"""Lines ``file_page`` returns at most."""
MAX_REPORTED_ERRORS = 100
"""Problems listed in a failed batch's ``errors`` at most."""


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
        self, tenant: str, purpose: str, filename: str, size: int, lines: Iterable[bytes], now: int
    ) -> Record:
        """Store a file whose content is ``lines`` (without newlines). An exception raised by
        ``lines`` stores nothing and propagates."""

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

    async def create_batch(
        self,
        tenant: str,
        input_file_id: str,
        endpoint: str,
        window: str,
        window_s: int,
        lane: str,
        metadata: dict[str, str] | None,
        now: int,
    ) -> Record:
        """A new ``validating`` batch."""

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
        """End every batch that is due (``batches/finish.py``); each new status."""

    async def claim(
        self, model: str, owner: str, limit: int, now: float, lease_s: float
    ) -> list[Claim]:
        """Up to ``limit`` runnable lines of ``model``, oldest batch first, leased to owner."""

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
