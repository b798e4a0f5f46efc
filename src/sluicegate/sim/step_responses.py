"""What a step's first and last tokens do at the gateway, as the driver's base class.

With ``EngineConfig.response_overhead_s`` zero they reach the scheduler as the step
ends; otherwise a ``RESPONSE`` event brings them that much later, and until then a
finished request still holds its gateway slot (its engine has already let it go).
Progress reports every 16 steps are made at step time either way.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

from sluicegate.core.decisions import Decision, Preempt
from sluicegate.core.ticket import Usage
from sluicegate.engine.model import StepResult
from sluicegate.outcomes import COMPLETED
from sluicegate.sim.events import RESPONSE
from sluicegate.sim.execute import DecisionExecution
from sluicegate.sim.replica import Replica

__all__ = ["StepResponses"]


class StepResponses(DecisionExecution, ABC):
    """Hands step results to the scheduler, over the run state ``_Simulation`` sets up."""

    response_overhead_s: float
    responses: dict[int, tuple[list[str], list[str]]]

    @abstractmethod
    def _after(self, now: float) -> None:
        """After the scheduler was told something: resume the replicas its decisions
        touched and re-arm the tick (the driver's, ``virtual_driver._Simulation``)."""

    def _on_step(self, rep: Replica, result: StepResult, now: float) -> None:
        """A step's first and last tokens reach the scheduler (``response_overhead_s``
        later, as a ``RESPONSE`` event, when that is set); then the replica steps on."""
        touched_scheduler = False
        if self.response_overhead_s > 0:
            if result.first_token or result.finished:
                item = self.events.push(
                    now + self.response_overhead_s, RESPONSE, rep.index, now, None
                )
                self.responses[item[4]] = (result.first_token, result.finished)
        else:
            touched_scheduler = self._on_tokens(rep, result.first_token, result.finished, now)
        rep.step_handled(now, self.scheduler.progress)
        if touched_scheduler or self.touched:
            self._after(now)

    def _on_tokens(self, rep: Replica, first: list[str], finished: list[str], now: float) -> bool:
        """First and last tokens reach the gateway: record them, and tell the scheduler of
        first tokens and completions (carrying out its decisions); whether it completed any.

        Requests preempted since the step that emitted them (no longer on ``rep``) are skipped.
        """
        running = rep.running
        touched_scheduler = False
        for eid in first:
            req = running.get(eid)
            if req is not None:
                req.first_token_s = now
                self.scheduler.progress(req.ticket_id, 1)
        if finished:
            # All of the step's answers end before any decision runs, so a ``Preempt``
            # caused by one completion never names another request that finished with it.
            done = [req for eid in finished if (req := running.pop(eid, None)) is not None]
            for req in done:
                req.generated = req.target
                req.end(COMPLETED, now)
                del self.live[req.ticket_id]
            decisions: list[Decision] = []
            for req in done:
                ttft = None if req.first_token_s is None else req.first_token_s - req.admitted_s
                usage = Usage(req.workload.prompt_tokens, req.target, ttft_s=ttft)
                decisions.extend(
                    self.scheduler.complete(req.ticket_id, usage, now, ran_to_end=True)
                )
                touched_scheduler = True
            live = self.live
            self._execute(
                [d for d in decisions if not isinstance(d, Preempt) or d.ticket.id in live], now
            )
        return touched_scheduler
