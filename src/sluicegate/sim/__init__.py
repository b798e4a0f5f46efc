"""The simulator: the real ``core.Scheduler`` and N engine models under a virtual clock."""

from __future__ import annotations

from sluicegate.outcomes import WorkloadRequest
from sluicegate.sim.metrics import Summary, summarize
from sluicegate.sim.result import SimResult
from sluicegate.sim.run import ComparisonResult, run_comparison

__all__ = [
    "ComparisonResult",
    "SimResult",
    "Summary",
    "WorkloadRequest",
    "run_comparison",
    "summarize",
]
