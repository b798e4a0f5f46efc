"""The simulator: the real ``core.Scheduler`` and N engine models under a virtual clock."""

from __future__ import annotations

from sluicegate.outcomes import WorkloadRequest
from sluicegate.sim.comparison import ComparisonResult, run_comparison
from sluicegate.sim.result import SimResult
from sluicegate.sim.run_summary import Summary, summarize

__all__ = [
    "ComparisonResult",
    "SimResult",
    "Summary",
    "WorkloadRequest",
    "run_comparison",
    "summarize",
]
