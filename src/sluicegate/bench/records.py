"""One load-generator request's measurements, and their CSV form.

Times are seconds measured on the generator's monotonic clock (``loop.time()``):

* ``scheduled_s`` is the request's intended start, relative to the start of the run
  (its ``WorkloadRequest.arrival_s``); it *launched* at ``scheduled_s + launch_lag_s``.
* ``ttft_s`` and ``e2e_s`` run from the launch (not the schedule) to the first content
  chunk and to the end of the response. Add ``launch_lag_s`` to get them from the
  scheduled start; while the generator keeps up (see ``LoadResult``) the two agree.

The CSV file has one header row naming the ``RequestRecord`` fields in order; ``None``
is written as an empty cell and floats with ``repr`` so a file reads back exactly.

``RequestRecord.as_outcome`` turns a measurement into the ``RequestOutcome`` that the
summaries read (``sluicegate.outcomes``), the same record the simulator produces.
"""

from __future__ import annotations

import csv
from collections.abc import Callable, Iterable
from dataclasses import astuple, dataclass, fields
from pathlib import Path

from sluicegate.outcomes import COMPLETED, RequestOutcome

CLIENT_TIMEOUT = "timeout"
"""``error`` of a request the generator gave up on after ``timeout_s``."""

CONNECTION_ERROR = "connection_error"
"""``error`` of a request that never got an HTTP response (refused, reset, DNS)."""

STREAM_INTERRUPTED = "stream_interrupted"
"""``error`` of a 2xx response whose body broke off before it ended."""

STREAM_ERROR = "stream_error"
"""``error`` of a stream that carried an error event without a ``code``."""

INVALID_RESPONSE = "invalid_response"
"""``error`` of a 2xx response whose body was not the JSON or SSE expected."""


@dataclass(frozen=True, slots=True)
class RequestRecord:
    """What the load generator measured for one request.

    Attributes:
        index: position of the request in the schedule as given.
        tenant: the request's tenant.
        lane: the lane it asked for.
        priority: 0 (critical) … 5 (background).
        prompt_tokens: the schedule's prompt length (the prompt sent is about 4× as
            many characters).
        max_tokens: ``max_tokens`` sent.
        deadline_ms: the request's own deadline, if the schedule gave one.
        scheduled_s: intended start, seconds from the start of the run.
        launch_lag_s: how late the request actually started (≥ 0).
        status: HTTP status, or 0 when no response arrived (see ``error``).
        error: OpenAI error ``code`` of a ≥ 400 response, a client-side code (this
            module's constants) for a failure, else ``""``.
        queue_ms: the gateway's ``X-Sluicegate-Queue-Ms`` header, if present.
        retry_after_s: the response's ``retry-after-ms`` / ``Retry-After``, if present.
        ttft_s: launch → first content chunk (streams), launch → response (otherwise).
        e2e_s: launch → end of the response (or the failure).
        output_tokens: ``usage.completion_tokens`` if reported, else content chunks
            counted in a stream, else 0.
        itl_mean_s: mean gap between consecutive content chunks (streams with ≥ 2).
        itl_max_s: largest such gap.
        finish_reason: the last ``finish_reason`` reported, else ``""``.
    """

    index: int
    tenant: str
    lane: str
    priority: int
    prompt_tokens: int
    max_tokens: int
    deadline_ms: float | None
    scheduled_s: float
    launch_lag_s: float
    status: int
    error: str
    queue_ms: float | None
    retry_after_s: float | None
    ttft_s: float | None
    e2e_s: float
    output_tokens: int
    itl_mean_s: float | None
    itl_max_s: float | None
    finish_reason: str

    @property
    def ok(self) -> bool:
        """The request succeeded: a 2xx status and no error (a broken stream is not ok)."""
        return 200 <= self.status < 300 and not self.error

    @property
    def launched_s(self) -> float:
        """When it actually started, seconds from the start of the run."""
        return self.scheduled_s + self.launch_lag_s

    @property
    def finished_s(self) -> float:
        """When it ended, seconds from the start of the run."""
        return self.launched_s + self.e2e_s

    def as_outcome(self, lane_slo_ms: float | None) -> RequestOutcome:
        """How this request ended, as the shared summary reads it.

        Its arrival is its launch: the server never saw the generator's lag, so every
        latency and the deadline run from the launch (as ``ttft_s`` and ``e2e_s`` do).
        The deadline is ``deadline_ms`` after the launch, else ``lane_slo_ms``, else
        none. A request that succeeded (``ok``) is ``completed``; any other ends with
        its ``error`` code, or ``http_<status>`` when it has none. It was admitted when
        the gateway's queue-wait header came back. The generator cannot know the true
        output length, the replica or requeues: ``output_tokens`` is ``max_tokens``,
        ``replica`` ``None`` and ``requeues`` 0.
        """
        arrival = self.launched_s
        slo_ms = self.deadline_ms if self.deadline_ms is not None else lane_slo_ms
        return RequestOutcome(
            index=self.index,
            tenant=self.tenant,
            lane=self.lane,
            priority=self.priority,
            outcome=COMPLETED if self.ok else self.error or f"http_{self.status}",
            arrival_s=arrival,
            admit_s=None if self.queue_ms is None else arrival + self.queue_ms / 1000.0,
            first_token_s=None if self.ttft_s is None else arrival + self.ttft_s,
            finish_s=arrival + self.e2e_s,
            deadline_s=None if slo_ms is None else arrival + slo_ms / 1000.0,
            prompt_tokens=self.prompt_tokens,
            output_tokens=self.max_tokens,
            generated_tokens=self.output_tokens,
            replica=None,
            requeues=0,
        )


COLUMNS: tuple[str, ...] = tuple(f.name for f in fields(RequestRecord))
"""CSV header: the ``RequestRecord`` field names in order."""


def _optional(parse: Callable[[str], float | int]) -> Callable[[str], float | int | None]:
    def convert(cell: str) -> float | int | None:
        return None if cell == "" else parse(cell)

    return convert


_PARSERS: dict[str, Callable[[str], object]] = {
    "int": int,
    "float": float,
    "str": str,
    "float | None": _optional(float),
    "int | None": _optional(int),
}
_COLUMN_PARSERS = tuple(_PARSERS[str(f.type)] for f in fields(RequestRecord))


def _cell(value: object) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return repr(value)
    return str(value)


def write_csv(records: Iterable[RequestRecord], path: str | Path) -> None:
    """Write ``records`` to ``path`` as CSV (header row first; see the module docstring)."""
    with Path(path).open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(COLUMNS)
        for record in records:
            writer.writerow([_cell(value) for value in astuple(record)])


def read_csv(path: str | Path) -> list[RequestRecord]:
    """Read records written by ``write_csv``, in file order.

    Raises:
        ValueError: the header lacks a column, or a cell does not parse (the message
            names the row and column).
    """
    with Path(path).open(newline="", encoding="utf-8") as handle:
        reader = csv.DictReader(handle)
        missing = [name for name in COLUMNS if name not in (reader.fieldnames or ())]
        if missing:
            raise ValueError(f"{path}: missing columns {', '.join(missing)}")
        return [_record(row, reader.line_num, path) for row in reader]


def _record(row: dict[str, str], line: int, path: str | Path) -> RequestRecord:
    values: list[object] = []
    for name, parse in zip(COLUMNS, _COLUMN_PARSERS, strict=True):
        try:
            values.append(parse(row[name]))
        except ValueError as exc:
            raise ValueError(f"{path}, line {line}, column {name!r}: {exc}") from exc
    return RequestRecord(*values)  # type: ignore[arg-type]
