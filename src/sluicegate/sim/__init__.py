"""The simulator: the real ``core.Scheduler`` and N engine models under a virtual clock."""

from __future__ import annotations

from sluicegate.sim.metrics import SimResult, Summary, summarize
from sluicegate.sim.request import WorkloadRequest
from sluicegate.sim.run import ComparisonResult, run_comparison

__all__ = [
    "ComparisonResult",
    "SimResult",
    "Summary",
    "WorkloadRequest",
    "run_comparison",
    "summarize",
]
