"""A replica's progress reports to the scheduler, as ``Replica``'s base class.

Every ``PROGRESS_EVERY_STEPS`` steps a replica reports each running request's
tokens generated so far (``Scheduler.progress``). Steps driven one event at a
time report when the step is handled (``report_progress``); inside a decode run
(``sim/decode_span.py``) the reports are owed, and made when the next event
reaches the scheduler (``flush_progress``) or the run ends: only the latest one
matters, since each sets every running request's count and nothing read them in
between.
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Callable

from sluicegate.core.ticket import TicketId
from sluicegate.engine.model import Engine
from sluicegate.sim.decode_span import DecodeSpan
from sluicegate.sim.events import HeapItem
from sluicegate.sim.live import SimRequest

__all__ = ["PROGRESS_EVERY_STEPS", "ProgressReports", "Report"]

PROGRESS_EVERY_STEPS = 16
"""A replica reports its requests' progress to the scheduler every this many steps."""

Report = Callable[[TicketId, int], None]
"""The scheduler's ``progress``: a ticket's tokens generated so far."""


class ProgressReports:
    """Progress reports over the replica state that ``Replica.__init__`` sets up.

    Attributes:
        reported: the step count at the last progress report.
        report_at: when the span's next progress report falls due (infinity: none).
    """

    __slots__ = ("report_at", "reported")

    reported: int
    report_at: float

    engine: Engine
    running: dict[str, SimRequest]
    span: DecodeSpan | None
    steps: int
    history: array[float]
    origin: tuple[float, int]

    def report_progress(self, report: Report) -> None:
        """Call ``report`` (the scheduler's ``progress``) with each running request's
        ticket and the tokens it has generated in the steps applied so far."""
        engine = self.engine
        for eid, req in self.running.items():
            try:
                generated = engine.generated(eid)
            except KeyError:  # finished inside a step still in flight
                continue
            report(req.ticket_id, generated)

    def flush_progress(self, event: HeapItem, report: Report) -> None:
        """Make the progress reports of a decode run that step-by-step driving would have
        made before ``event``, which is about to reach the scheduler.

        Inside a run only the latest report counts: each sets every running request's
        count, and nothing read them since the last flush. The driver calls this only
        once ``report_at`` has come.
        """
        span = self.span
        if span is not None:
            self._report_span(span, span.passed(event, self.history, self.origin) - 1, report)
            self._next_report(span)

    def _next_report(self, span: DecodeSpan) -> None:
        """Set ``report_at`` to the completion time of the span's next report, if any."""
        before = span.steps_before
        boundary = (max(self.reported, before) // PROGRESS_EVERY_STEPS + 1) * PROGRESS_EVERY_STEPS
        j = boundary - before
        self.report_at = span.times[j] if j < span.run.steps else math.inf

    def _report_span(self, span: DecodeSpan, completed: int, report: Report) -> None:
        """Report progress as of the span's last report point among its first ``completed``
        completions, unless that report was made."""
        count = span.steps_before + completed
        at = count - count % PROGRESS_EVERY_STEPS
        if at <= self.reported or at <= span.steps_before:
            return
        self.reported = at
        done = at - span.steps_before  # the span's steps applied when the report is made
        engine = self.engine
        for eid, req in self.running.items():
            try:
                generated = engine.generated(eid) + done
            except KeyError:  # finished, its last token not yet at the gateway
                continue
            report(req.ticket_id, generated)
