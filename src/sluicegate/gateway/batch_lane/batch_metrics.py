"""What the batch lane shows: Prometheus metrics and the ``batches`` part of ``/admin/state``.

The line and batch counts come from the database, read by the runner every
``poll_interval_s`` (a scrape never waits for the disk). Under ``serve
--workers`` every worker reads the same database, so only worker 0 exports
those gauges; each worker counts the lines it ended itself.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from sluicegate.store.store_errors import StorageError

LINE_STATES = ("queued", "running", "completed", "failed")
BATCH_STATUSES = (
    "validating",
    "in_progress",
    "finalizing",
    "completed",
    "failed",
    "expired",
    "cancelling",
    "cancelled",
)


class BatchProgress(Collector):
    """The batch lane's counts: lines per model and state, batches per status."""

    def __init__(self, registry: CollectorRegistry, *, export_gauges: bool) -> None:
        self.lines: dict[tuple[str, str], int] = {}
        self.batches: dict[str, int] = {}
        self._ended = Counter(
            "sluicegate_batch_line_runs",
            "Runs of batch lines this process ended, by what came of them (completed, failed,"
            " preempted and deferred lines run again; retried is an engine failure retried).",
            ["model", "outcome"],
            registry=registry,
        )
        self._storage_errors = Counter(
            "sluicegate_batch_storage_errors",
            "Batch storage failures: API requests refused (source api: 507 storage_full, 503"
            " storage_unavailable) and runner ticks that failed (source runner), by kind.",
            ["source", "kind"],
            registry=registry,
        )
        self.storage = "ok"
        """What the runner's last tick met: ``ok``, ``full`` or ``unavailable``."""
        if export_gauges:
            registry.register(self)

    def update(self, lines: dict[tuple[str, str], int], batches: dict[str, int]) -> None:
        """The counts the runner just read from the database."""
        self.lines = lines
        self.batches = batches

    def storage_error(self, source: str, failure: StorageError) -> None:
        """A call of ``source`` (``api`` or ``runner``) met ``failure``."""
        self._storage_errors.labels(source, "full" if failure.full else "unavailable").inc()

    def ended(self, model: str, outcome: str) -> None:
        """One run of a line ended with ``outcome``."""
        self._ended.labels(model, outcome).inc()

    def collect(self) -> Iterator[GaugeMetricFamily]:
        lines = GaugeMetricFamily(
            "sluicegate_batch_lines",
            "Lines of unfinished batches per model and state (queued, running, completed, failed).",
            labels=["model", "state"],
        )
        models = sorted({model for model, _ in self.lines})
        for model in models:
            for state in LINE_STATES:
                lines.add_metric([model, state], self.lines.get((model, state), 0))
        yield lines
        batches = GaugeMetricFamily("sluicegate_batches", "Batches per status.", labels=["status"])
        for status in BATCH_STATUSES:
            batches.add_metric([status], self.batches.get(status, 0))
        yield batches

    def state(self) -> dict[str, object]:
        """The ``batches`` part of ``/admin/state``."""
        models: dict[str, dict[str, int]] = {}
        for (model, state), count in sorted(self.lines.items()):
            models.setdefault(model, dict.fromkeys(LINE_STATES, 0))[state] = count
        return {
            "lines": models,
            "batches": {s: self.batches.get(s, 0) for s in BATCH_STATUSES},
            "storage": self.storage,
        }
