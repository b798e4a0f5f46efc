"""Carrying out the scheduler's decisions in the simulator, as the driver's base class.

It owns what each decision does to the simulated requests and replicas:

* ``Admit`` → ``Engine.add_request`` on the chosen replica (with the ticket's priority
  when its backend passes it through), ``EngineConfig.request_overhead_s`` later: until
  then the request is in transit, holding its gateway slot (a ``DELIVER`` event);
* ``Preempt`` → ``Engine.abort``, then ``Scheduler.complete`` with the tokens produced,
  whose decisions are carried out in turn;
* ``Reject`` / ``Expire`` → the request's outcome; ``Queued`` → its wait estimate;
  ``Reserve`` raises (the simulator never runs in distributed mode).

A replica a decision changed is noted in ``touched``; the event loop
(``sim/virtual_driver.py``) resumes it once the instant's decisions are done.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from typing import assert_never

from sluicegate.core.decisions import (
    Admit,
    Decision,
    Expire,
    Preempt,
    PreemptAction,
    Queued,
    Reject,
    Reserve,
)
from sluicegate.core.scheduler import Scheduler
from sluicegate.core.ticket import TicketId, Usage
from sluicegate.sim.events import DELIVER, EventQueue, HeapItem
from sluicegate.sim.live import SimRequest
from sluicegate.sim.replica import Replica
from sluicegate.sim.result import PREEMPTED

__all__ = ["DecisionExecution"]


class DecisionExecution:
    """Executes decisions on the run state that ``_Simulation.__init__`` sets up."""

    scheduler: Scheduler
    live: dict[TicketId, SimRequest]
    by_backend: dict[str, Replica]
    touched: list[Replica]
    event: HeapItem
    estimated_wait: dict[int, float]
    events: EventQueue
    request_overhead_s: float
    deliveries: dict[int, tuple[SimRequest, int]]
    in_transit: dict[TicketId, int]

    def _touch(self, rep: Replica) -> None:
        """Note that decisions at this instant changed ``rep`` (``_after`` resumes it)."""
        if not rep.touched:
            rep.touched = True
            self.touched.append(rep)

    def _execute(self, decisions: Iterable[Decision], now: float) -> None:
        queue = deque(decisions)
        while queue:
            decision = queue.popleft()
            match decision:  # exhaustive: a kind without a case fails mypy (assert_never)
                case Admit():
                    self._admit(decision, now)
                case Queued():
                    if decision.estimated_wait_s is not None:
                        index = self.live[decision.ticket.id].index
                        self.estimated_wait[index] = decision.estimated_wait_s
                case Reject() | Expire():
                    self.live.pop(decision.ticket.id).end(decision.outcome.value, now)
                case Preempt():
                    queue.extend(self._preempt(decision, now))
                case Reserve():
                    raise AssertionError("Reserve comes only in distributed mode")
                case _:
                    assert_never(decision)

    def _admit(self, decision: Admit, now: float) -> None:
        req = self.live[decision.ticket.id]
        rep = self.by_backend[decision.backend]
        rep.assign(req, now)
        if self.request_overhead_s > 0:
            item = self.events.push(now + self.request_overhead_s, DELIVER, rep.index, now, None)
            self.deliveries[item[4]] = (req, decision.ticket.priority)
            self.in_transit[req.ticket_id] = item[4]
            return
        rep.sync(self.event)
        rep.add(req, now, decision.ticket.priority)
        self._touch(rep)

    def _deliver(self, rep: Replica, seq: int, now: float) -> None:
        """A request in transit (``seq``, unless preempted on the way) reaches ``rep``'s engine."""
        delivery = self.deliveries.pop(seq, None)
        if delivery is None:
            return
        req, priority = delivery
        del self.in_transit[req.ticket_id]
        rep.sync(self.event)
        rep.add(req, now, priority)
        self._touch(rep)

    def _preempt(self, decision: Preempt, now: float) -> list[Decision]:
        req = self.live[decision.ticket.id]
        rep = self.by_backend[decision.backend]
        transit = self.in_transit.pop(req.ticket_id, None)
        if transit is not None:  # never reached the engine
            del self.deliveries[transit]
            generated = 0
        else:
            rep.sync(self.event)
            generated = rep.abort(req, now)
            self._touch(rep)
        if decision.action is PreemptAction.REQUEUE:
            req.requeues += 1
            req.first_token_s = None
        else:
            req.generated = generated
            req.end(PREEMPTED, now)
            del self.live[req.ticket_id]
        usage = Usage(req.workload.prompt_tokens, generated)
        return self.scheduler.complete(req.ticket_id, usage, now)
