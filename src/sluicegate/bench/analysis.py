"""Latency summaries of load-generator records, per lane and overall, as rich tables.

Definitions (every figure follows them):

* A request **succeeded** when its status is 2xx and it has no error (``RequestRecord.ok``;
  a stream that broke off is a failure). **Status counts** split all requests into
  ``2xx``, ``429``, ``503`` and ``other`` (other ≥ 400 codes and 0, no response).
* **TTFT**, **end-to-end** and **inter-token gap** (each request's mean gap between
  content chunks) run from the request's launch; **queue wait** is the gateway's
  ``X-Sluicegate-Queue-Ms``. All four are taken over successful requests only (queue
  wait over those that carried the header). Percentiles are numpy's
  ``method="linear"``, as in the simulator's report.
* The **SLO** of a request is its own ``deadline_ms``, else its lane's entry in
  ``slo_ms_by_lane``. It is met when the request succeeded with its end-to-end latency
  (or TTFT, with ``slo_on="ttft"``) ≤ the SLO. A request without any SLO is **good**
  when it succeeds; one with an SLO is good when it meets it.
* **SLO attainment** = good requests / all requests of the group (rejected and failed
  included: a request turned away missed its SLO); ``None`` for a group in which no
  request has an SLO.
* **Goodput** = good requests (and their output tokens) per second; **throughput**
  counts the output tokens of every successful request. Every group is divided by the
  same span, from the first scheduled start until the last request ended, so lane
  figures add up to the overall one.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from rich.table import Table

from sluicegate.bench.records import RequestRecord
from sluicegate.sim.metrics import LatencyStats

OVERALL = "all"
"""``LaneSummary.lane`` of the summary over every request."""

STATUS_CLASSES = ("2xx", "429", "503", "other")

SloOn = Literal["e2e", "ttft"]


@dataclass(frozen=True, slots=True)
class LaneSummary:
    """Summary of one lane's requests (or of all, with ``lane == OVERALL``).

    Attributes:
        lane: the lane, or ``OVERALL``.
        requests: requests in the group.
        succeeded: requests that succeeded (see the module docstring).
        status_counts: requests per status class, keys ``STATUS_CLASSES`` in order.
        error_counts: requests per error code (OpenAI ``code`` or client-side), sorted.
        ttft: time to first token of successful requests, seconds.
        e2e: end-to-end latency of successful requests, seconds.
        queue_wait: gateway queue wait of successful requests, seconds.
        itl: per-request mean inter-token gap of successful streams, seconds.
        slo_ms: the lane's SLO from ``slo_ms_by_lane`` (``None`` for OVERALL or unset).
        slo_attainment: good requests / all requests; ``None`` if none has an SLO.
        goodput_rps: good requests per second.
        goodput_tokens_per_s: output tokens of good requests per second.
        throughput_tokens_per_s: output tokens of successful requests per second.
        span_s: the seconds every rate is divided by.
    """

    lane: str
    requests: int
    succeeded: int
    status_counts: Mapping[str, int]
    error_counts: Mapping[str, int]
    ttft: LatencyStats
    e2e: LatencyStats
    queue_wait: LatencyStats
    itl: LatencyStats
    slo_ms: float | None
    slo_attainment: float | None
    goodput_rps: float
    goodput_tokens_per_s: float
    throughput_tokens_per_s: float
    span_s: float


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
    slo_on: SloOn = "e2e",
    span_s: float | None = None,
) -> list[LaneSummary]:
    """Per-lane summaries in order of each lane's first request, then the overall one.

    Args:
        records: the run's records.
        slo_ms_by_lane: each lane's SLO in ms, for requests without their own deadline.
        slo_on: the latency an SLO bounds: end-to-end (default) or time to first token.
        span_s: divide rates by this instead of ``records_span_s(records)`` (e.g. a
            ``LoadResult.duration_s``).
    """
    slos = dict(slo_ms_by_lane or {})
    span = records_span_s(records) if span_s is None else span_s
    lanes: dict[str, list[RequestRecord]] = {}
    for record in records:
        lanes.setdefault(record.lane, []).append(record)
    summaries = [
        _group(lane, group, slos, slos.get(lane), slo_on, span) for lane, group in lanes.items()
    ]
    summaries.append(_group(OVERALL, records, slos, None, slo_on, span))
    return summaries


def _slo_ms(record: RequestRecord, slos: Mapping[str, float]) -> float | None:
    return record.deadline_ms if record.deadline_ms is not None else slos.get(record.lane)


def _good(record: RequestRecord, slo_ms: float | None, slo_on: SloOn) -> bool:
    if not record.ok:
        return False
    if slo_ms is None:
        return True
    latency_s = record.e2e_s if slo_on == "e2e" else record.ttft_s
    return latency_s is not None and latency_s * 1000.0 <= slo_ms


def _group(
    lane: str,
    records: Sequence[RequestRecord],
    slos: Mapping[str, float],
    lane_slo_ms: float | None,
    slo_on: SloOn,
    span_s: float,
) -> LaneSummary:
    statuses = dict.fromkeys(STATUS_CLASSES, 0)
    errors: dict[str, int] = {}
    good = good_tokens = tokens = with_slo = 0
    for record in records:
        statuses[status_class(record.status)] += 1
        if record.error:
            errors[record.error] = errors.get(record.error, 0) + 1
        slo_ms = _slo_ms(record, slos)
        with_slo += slo_ms is not None
        if record.ok:
            tokens += record.output_tokens
        if _good(record, slo_ms, slo_on):
            good += 1
            good_tokens += record.output_tokens
    succeeded = [r for r in records if r.ok]
    return LaneSummary(
        lane=lane,
        requests=len(records),
        succeeded=len(succeeded),
        status_counts=statuses,
        error_counts=dict(sorted(errors.items())),
        ttft=LatencyStats.of([r.ttft_s for r in succeeded if r.ttft_s is not None]),
        e2e=LatencyStats.of([r.e2e_s for r in succeeded]),
        queue_wait=LatencyStats.of(
            [r.queue_ms / 1000.0 for r in succeeded if r.queue_ms is not None]
        ),
        itl=LatencyStats.of([r.itl_mean_s for r in succeeded if r.itl_mean_s is not None]),
        slo_ms=lane_slo_ms,
        slo_attainment=good / len(records) if with_slo and records else None,
        goodput_rps=good / span_s,
        goodput_tokens_per_s=good_tokens / span_s,
        throughput_tokens_per_s=tokens / span_s,
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
