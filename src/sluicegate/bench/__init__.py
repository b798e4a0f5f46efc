"""Open-loop load generation against OpenAI-compatible servers, and latency analysis.

* :mod:`~sluicegate.bench.loadgen`: ``run_load`` replays a ``WorkloadRequest`` schedule
  open-loop over HTTP and returns a ``LoadResult`` (records + the generator's own lag).
* :mod:`~sluicegate.bench.records`: ``RequestRecord`` and its CSV form; ``as_outcome``
  turns one into the ``sluicegate.outcomes.RequestOutcome`` the summaries read.
* :mod:`~sluicegate.bench.analysis`: per-lane summaries (the simulator's definitions of
  good, SLO attainment and goodput, from ``sluicegate.outcomes``), rich tables and
  comparisons.
"""

from __future__ import annotations

from sluicegate.bench.analysis import (
    OVERALL,
    STATUS_CLASSES,
    LaneSummary,
    compare,
    records_span_s,
    render_summary,
    status_class,
    summarize,
)
from sluicegate.bench.loadgen import (
    DEFAULT_MAX_LAG_S,
    Endpoint,
    LoadResult,
    build_body,
    build_headers,
    endpoint_url,
    run_load,
    synthetic_prompt,
)
from sluicegate.bench.records import COLUMNS, RequestRecord, read_csv, write_csv

__all__ = [
    "COLUMNS",
    "DEFAULT_MAX_LAG_S",
    "OVERALL",
    "STATUS_CLASSES",
    "Endpoint",
    "LaneSummary",
    "LoadResult",
    "RequestRecord",
    "build_body",
    "build_headers",
    "compare",
    "endpoint_url",
    "read_csv",
    "records_span_s",
    "render_summary",
    "run_load",
    "status_class",
    "summarize",
    "synthetic_prompt",
    "write_csv",
]
