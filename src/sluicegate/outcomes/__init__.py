"""Requests and how they ended: what the simulator (``sim``) and the load generator share.

* :mod:`~sluicegate.outcomes.request`: ``WorkloadRequest``, a request both replay.
* :mod:`~sluicegate.outcomes.record`: ``RequestOutcome``, how one request ended, and the
  latencies measured from it.
* :mod:`~sluicegate.outcomes.stats`: ``OutcomeStats``, the one summary of many, with the
  one definition of a good request, SLO attainment, goodput and percentiles.

This package imports neither ``sim`` nor ``bench`` (nor anything else of sluicegate), so
both can build on it without importing each other.
"""

from __future__ import annotations

from sluicegate.outcomes.record import COMPLETED, RequestOutcome
from sluicegate.outcomes.request import WorkloadRequest
from sluicegate.outcomes.stats import PERCENTILES, LatencyStats, OutcomeStats

__all__ = [
    "COMPLETED",
    "PERCENTILES",
    "LatencyStats",
    "OutcomeStats",
    "RequestOutcome",
    "WorkloadRequest",
]
