"""Latency summaries of load-generator records, per lane and overall, as rich tables.

The figures every summary shares (latency percentiles, SLO attainment, goodput and
throughput) follow the one definition of ``sluicegate.outcomes.stats``, the same as the
simulator's report, applied to each record's ``RequestRecord.as_outcome``:

* A request **succeeded** (``completed``) when its status is 2xx and it has no error
  (``RequestRecord.ok``; a stream that broke off is a failure). Its arrival is its launch,
  so **TTFT** and **end-to-end** (over successful requests) run from the launch, and
  **queue wait** is the gateway's ``X-Sluicegate-Queue-Ms``, over the requests that
  carried it (those the gateway admitted). Percentiles are numpy's ``method="linear"``.
* Its **deadline** is its own ``deadline_ms``, else its lane's entry in
  ``slo_ms_by_lane``, after its launch. It is **good** when it succeeded by its
  deadline, or succeeded at all when it has none.
* **SLO attainment** = good requests / all requests of the group (rejected and failed
  included: a request turned away missed its SLO); ``None`` for a group in which no
  request has a deadline.
* **Goodput** = good requests (and their output tokens) per second; **throughput**
  counts the output tokens of every request. Every group is divided by the same span,
  from the first scheduled start until the last request ended, so lane figures add up
  to the overall one.

On top of those, the load generator reports **status counts**, which split all
requests into ``2xx``, ``429``, ``503`` and ``other`` (other ≥ 400 codes and 0, no
response), **error counts** per code, and the **inter-token gap** (each successful
stream's mean gap between content chunks).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from rich.table import Table

from sluicegate.bench.records import RequestRecord
from sluicegate.outcomes import LatencyStats, OutcomeStats, RequestOutcome

OVERALL = "all"
"""``LaneSummary.lane`` of the summary over every request."""

STATUS_CLASSES = ("2xx", "429", "503", "other")


@dataclass(frozen=True, slots=True)
class LaneSummary(OutcomeStats):
    """Summary of one lane's requests (or of all, with ``lane == OVERALL``).

    Attributes (besides ``OutcomeStats``', whose ``outcomes`` are ``completed`` and
    the error codes):
        lane: the lane, or ``OVERALL``.
        status_counts: requests per status class, keys ``STATUS_CLASSES`` in order.
        error_counts: requests per error code (OpenAI ``code`` or client-side), sorted.
        itl: per-request mean inter-token gap of successful streams, seconds.
        slo_ms: the lane's SLO from ``slo_ms_by_lane`` (``None`` for OVERALL or unset).
        span_s: the seconds every rate is divided by.
    """

    lane: str
    status_counts: Mapping[str, int]
    error_counts: Mapping[str, int]
    itl: LatencyStats
    slo_ms: float | None
    span_s: float

    @property
    def succeeded(self) -> int:
        """Requests that succeeded (see the module docstring)."""
        return self.completed


def status_class(status: int) -> str:
    """The status class of ``status``: ``2xx``, ``429``, ``503`` or ``other``."""
    if 200 <= status < 300:
        return "2xx"
    if status in (429, 503):
        return str(status)
    return "other"


def records_span_s(records: Sequence[RequestRecord]) -> float:
    """First scheduled start → last end of ``records`` (at least 1 ns; 1 ns when empty)."""
    if not records:
        return 1e-9
    first = min(r.scheduled_s for r in records)
    last = max(r.finished_s for r in records)
    return max(last - first, 1e-9)


def summarize(
    records: Sequence[RequestRecord],
    slo_ms_by_lane: Mapping[str, float] | None = None,
    *,
    span_s: float | None = None,
) -> list[LaneSummary]:
    """Per-lane summaries in order of each lane's first request, then the overall one.

    Args:
        records: the run's records.
        slo_ms_by_lane: each lane's SLO in ms, for requests without their own deadline.
        span_s: divide rates by this instead of ``records_span_s(records)`` (e.g. a
            ``LoadResult.duration_s``).
    """
    slos = dict(slo_ms_by_lane or {})
    span = records_span_s(records) if span_s is None else span_s
    pairs = [(record, record.as_outcome(slos.get(record.lane))) for record in records]
    lanes: dict[str, list[tuple[RequestRecord, RequestOutcome]]] = {}
    for pair in pairs:
        lanes.setdefault(pair[0].lane, []).append(pair)
    summaries = [_group(lane, group, slos.get(lane), span) for lane, group in lanes.items()]
    summaries.append(_group(OVERALL, pairs, None, span))
    return summaries


def _group(
    lane: str,
    pairs: Sequence[tuple[RequestRecord, RequestOutcome]],
    lane_slo_ms: float | None,
    span_s: float,
) -> LaneSummary:
    statuses = dict.fromkeys(STATUS_CLASSES, 0)
    errors: dict[str, int] = {}
    gaps: list[float] = []
    for record, _ in pairs:
        statuses[status_class(record.status)] += 1
        if record.error:
            errors[record.error] = errors.get(record.error, 0) + 1
        if record.ok and record.itl_mean_s is not None:
            gaps.append(record.itl_mean_s)
    return LaneSummary.of(
        [outcome for _, outcome in pairs],
        span_s,
        lane=lane,
        status_counts=statuses,
        error_counts=dict(sorted(errors.items())),
        itl=LatencyStats.of(gaps),
        slo_ms=lane_slo_ms,
        span_s=span_s,
    )


def _ms(seconds: float | None) -> str:
    return "—" if seconds is None else f"{seconds * 1000.0:.1f}"


def _pct(fraction: float | None) -> str:
    return "—" if fraction is None else f"{fraction * 100.0:.1f}%"


_SUMMARY_COLUMNS = ("lane", "reqs", "2xx", "429", "503", "other", "TTFT p50", "TTFT p99",
                    "E2E p50", "E2E p90", "E2E p99", "E2E p99.9", "queue p50", "queue p99",
                    "ITL p50", "SLO", "good/s", "good tok/s")  # fmt: skip


def render_summary(summaries: Sequence[LaneSummary], title: str) -> Table:
    """A rich table of ``summaries``, one row each; latencies in milliseconds."""
    table = Table(title=title)
    for index, name in enumerate(_SUMMARY_COLUMNS):
        table.add_column(name, justify="left" if index == 0 else "right")
    for s in summaries:
        table.add_row(
            s.lane,
            str(s.requests),
            *(str(s.status_counts.get(key, 0)) for key in STATUS_CLASSES),
            _ms(s.ttft.p50),
            _ms(s.ttft.p99),
            _ms(s.e2e.p50),
            _ms(s.e2e.p90),
            _ms(s.e2e.p99),
            _ms(s.e2e.p999),
            _ms(s.queue_wait.p50),
            _ms(s.queue_wait.p99),
            _ms(s.itl.p50),
            _pct(s.slo_attainment),
            f"{s.goodput_rps:.2f}",
            f"{s.goodput_tokens_per_s:.1f}",
            end_section=s.lane == OVERALL,
        )
    return table


def _count(status: str) -> Callable[[LaneSummary], float | None]:
    return lambda s: float(s.status_counts.get(status, 0))


_COMPARED: tuple[tuple[str, str, Callable[[LaneSummary], float | None]], ...] = (
    ("requests", "n", lambda s: float(s.requests)),
    ("succeeded", "n", lambda s: float(s.succeeded)),
    ("429", "n", _count("429")),
    ("503", "n", _count("503")),
    ("TTFT p50", "ms", lambda s: s.ttft.p50),
    ("TTFT p99", "ms", lambda s: s.ttft.p99),
    ("E2E p50", "ms", lambda s: s.e2e.p50),
    ("E2E p99", "ms", lambda s: s.e2e.p99),
    ("E2E p99.9", "ms", lambda s: s.e2e.p999),
    ("queue p99", "ms", lambda s: s.queue_wait.p99),
    ("SLO attainment", "%", lambda s: s.slo_attainment),
    ("goodput req/s", "/s", lambda s: s.goodput_rps),
    ("goodput tok/s", "/s", lambda s: s.goodput_tokens_per_s),
)
"""(metric, unit, getter) rows of ``compare``; "ms" getters return seconds."""


def _fmt(value: float | None, unit: str) -> str:
    if value is None:
        return "—"
    if unit == "ms":
        return _ms(value)
    if unit == "%":
        return _pct(value)
    return f"{value:.0f}" if unit == "n" else f"{value:.2f}"


def ratio(a: float | None, b: float | None) -> float | None:
    """``b / a``, or ``None`` when either is missing or ``a`` is 0."""
    if a is None or b is None or a == 0.0:
        return None
    return b / a


def compare(a: Sequence[LaneSummary], b: Sequence[LaneSummary], labels: tuple[str, str]) -> Table:
    """Side-by-side table of two runs' summaries, lane by lane, with the ratio B / A.

    Lanes are matched by name (those of ``a`` first, then lanes only ``b`` has, the
    overall row last); a lane missing from one run shows "—". A ratio below 1 is an
    improvement for latencies and rejections and a regression for goodput.
    """
    table = Table(title=f"{labels[1]} vs {labels[0]}")
    for name in ("lane", "metric", labels[0], labels[1], f"{labels[1]} / {labels[0]}"):
        table.add_column(name, justify="left" if name in ("lane", "metric") else "right")
    by_lane_a = {s.lane: s for s in a}
    by_lane_b = {s.lane: s for s in b}
    lanes = [s.lane for s in a if s.lane != OVERALL]
    lanes += [s.lane for s in b if s.lane != OVERALL and s.lane not in by_lane_a]
    lanes.append(OVERALL)
    for lane in lanes:
        summary_a, summary_b = by_lane_a.get(lane), by_lane_b.get(lane)
        for i, (metric, unit, get) in enumerate(_COMPARED):
            value_a = None if summary_a is None else get(summary_a)
            value_b = None if summary_b is None else get(summary_b)
            r = ratio(value_a, value_b)
            table.add_row(
                lane if i == 0 else "",
                metric,
                _fmt(value_a, unit),
                _fmt(value_b, unit),
                "—" if r is None else f"{r:.2f}×",
                end_section=i == len(_COMPARED) - 1,
            )
    return table
