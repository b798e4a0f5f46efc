"""Sans-I/O scheduling core: tickets, policies, limits, predictor, router and the Scheduler.

Nothing in this package performs I/O or reads a clock: every call takes ``now``.
"""

from __future__ import annotations

from sluicegate.core.core_errors import UnknownModelError
from sluicegate.core.decisions import (
    Admit,
    Decision,
    ErrorCode,
    Expire,
    Preempt,
    PreemptAction,
    Queued,
    Reject,
    Reserve,
)
from sluicegate.core.entry import State
from sluicegate.core.scheduler import Scheduler
from sluicegate.core.spec import (
    AdaptiveSpec,
    AfterFraction,
    BackendSpec,
    LaneSpec,
    ModelSpec,
    SchedulerSpec,
    TenantSpec,
    default_lanes,
)
from sluicegate.core.ticket import BackendStats, Feedback, Outcome, Ticket, TicketId, Usage
from sluicegate.core.views import BackendView, LaneView, ModelView

__all__ = [
    "AdaptiveSpec",
    "Admit",
    "AfterFraction",
    "BackendSpec",
    "BackendStats",
    "BackendView",
    "Decision",
    "ErrorCode",
    "Expire",
    "Feedback",
    "LaneSpec",
    "LaneView",
    "ModelSpec",
    "ModelView",
    "Outcome",
    "Preempt",
    "PreemptAction",
    "Queued",
    "Reject",
    "Reserve",
    "Scheduler",
    "SchedulerSpec",
    "State",
    "TenantSpec",
    "Ticket",
    "TicketId",
    "UnknownModelError",
    "Usage",
    "default_lanes",
]
