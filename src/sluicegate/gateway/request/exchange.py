"""One request being served: what every step needs, and the one way its ticket ends.

An ``Exchange`` is created when a request's ticket is submitted and lives until
``serve_ticket`` returns (``serving.py``). Whatever happens (an answer, a refusal,
a disconnect, a preemption, an engine failure, a bug), the ticket ends through
``finish``, and only the first call counts: the slot is given back once, the
outcome counted once. Answers go to the request's ``Sink`` through ``reply`` and
``open_stream``, which also keep what was answered for the outcome.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable

from sluicegate.core.decisions import Admit
from sluicegate.core.ticket import Feedback, Outcome, Ticket, Usage
from sluicegate.gateway.asyncio_driver import RunningHandle, SchedulerDriver, Verdict
from sluicegate.gateway.http_errors import GatewayError
from sluicegate.gateway.request.gateway_metrics import GatewayMetrics
from sluicegate.gateway.request.interrupts import Interruptible
from sluicegate.gateway.request.sink import Reply, Sink

log = logging.getLogger("sluicegate.gateway")
# Outcomes the scheduler decided itself: the ticket is already gone from it.
_REFUSALS = frozenset(
    {
        Outcome.REJECTED_RATE_LIMIT,
        Outcome.REJECTED_QUEUE_FULL,
        Outcome.REJECTED_UNAVAILABLE,
        Outcome.EXPIRED,
        Outcome.SHED,
    }
)


class Exchange:
    """One request from the submission of its ticket to its end.

    Holds the ``sink`` its answer goes to, the ticket, the request body as received
    (``raw``), the interrupt state, and the latest ``admit`` (``None`` until the
    first; kept through a requeue, for the answer's queue time). ``running`` says
    whether the ticket holds a slot now. ``finish`` ends the ticket; ``outcome``
    says how once it has. ``answered`` is the whole answer sent, if one was;
    ``streamed`` whether an event stream was started instead.
    """

    __slots__ = (
        "_driver",
        "_lane",
        "_metrics",
        "admit",
        "answered",
        "interrupts",
        "outcome",
        "raw",
        "running",
        "sink",
        "streamed",
        "ticket",
    )

    def __init__(
        self,
        sink: Sink,
        ticket: Ticket,
        raw: bytes,
        driver: SchedulerDriver,
        metrics: GatewayMetrics,
    ) -> None:
        self.sink = sink
        self.ticket = ticket
        self.raw = raw
        self.interrupts = Interruptible()
        self.admit: Admit | None = None
        self.running = False
        self.outcome: Outcome | None = None
        self.answered: Reply | None = None
        self.streamed = False
        self._driver = driver
        self._metrics = metrics
        self._lane = metrics.lane(ticket.model, ticket.lane)

    @property
    def handle(self) -> RunningHandle:
        """The driver's handle of the running ticket (only while admitted)."""
        return self._driver.handle(self.ticket.id)

    def admitted(self, admit: Admit) -> None:
        """The ticket was admitted: it runs on ``admit.backend`` and holds a slot."""
        self.admit = admit
        self.running = True
        self._lane.waited(admit.queued_s)

    def since_arrival(self) -> float:
        """Seconds from the ticket's arrival to now, on the scheduling clock."""
        return self._driver.now() - self.ticket.arrival

    def cut_short(self, generated: int = 0, *, ok: bool = True) -> Usage:
        """The usage of an answer that never reached the client whole.

        A failure (``ok=False``) is a drop for the adaptive limit and a failure for the
        circuit; anything else that ends so (a disconnect, a preemption) tells them
        nothing.
        """
        feedback = Feedback.IGNORE if ok else Feedback.DROP
        return Usage(self.ticket.prompt_tokens, generated, ok=ok, feedback=feedback)

    def finish(
        self, outcome: Outcome, usage: Usage | None = None, *, ttft_s: float | None = None
    ) -> bool:
        """End the ticket with ``outcome``, once; return whether this call ended it.

        A running ticket gives its slot back with ``usage`` (default: cut short,
        telling nothing) and its duration, time to first token (``ttft_s``, from
        arrival) and tokens are counted; a waiting one leaves its queue; a refused
        one is already gone from the scheduler. Every later call does nothing.
        """
        if self.outcome is not None:
            return False
        self.outcome = outcome
        ticket = self.ticket
        if self.running:
            self.running = False
            if usage is None:
                usage = self.cut_short()
            self._driver.complete(ticket.id, usage, ran_to_end=outcome is Outcome.COMPLETED)
            self._lane.ended(outcome)
            self._lane.duration.observe(self.since_arrival())
            if ttft_s is not None:
                self._lane.ttft.observe(ttft_s)
            self._metrics.served(
                ticket.model, ticket.tenant, usage.prompt_tokens, usage.completion_tokens
            )
            return True
        if outcome not in _REFUSALS:
            self._driver.cancel(ticket.id)
        self._lane.ended(outcome)
        return True

    def fail(self, error: GatewayError) -> GatewayError:
        """End the ticket as an engine failure (``upstream_error``, a drop); the error to
        answer with."""
        self.finish(Outcome.UPSTREAM_ERROR, self.cut_short(ok=False))
        return error

    def fault(self) -> GatewayError:
        """End the ticket as the gateway's own failure (``internal_error``): the slot is
        given back telling the circuit, the adaptive limit and the predictor nothing. The
        error to answer with."""
        usage = Usage(self.ticket.prompt_tokens, 0, ok=None, feedback=Feedback.IGNORE)
        self.finish(Outcome.INTERNAL_ERROR, usage)
        return GatewayError(500, "internal_error", "the gateway failed to serve the request")

    def bounce(self) -> asyncio.Future[Verdict]:
        """The backend refused the connection before anything was sent: it is marked down,
        and the ticket gives its slot back without ending and waits in its queue again
        (``Scheduler.bounce``). The future resolves with its next verdict: an admission
        elsewhere, or an ``Expire`` when it may not wait again."""
        ticket, admit = self.ticket, self.admit
        assert admit is not None
        log.warning(
            "backend %s of model %s refused the connection of request %s: marked down, "
            "the request waits for another backend",
            admit.backend,
            ticket.model,
            ticket.id,
        )
        # A preemption or deadline of the attempt that never started is moot now.
        self.interrupts.reset()
        waiting = self._driver.requeue_wait(ticket.id)
        self._driver.bounce(ticket.id)
        self.running = False
        return waiting

    def requeue(self, generated: int) -> asyncio.Future[Verdict]:
        """A requeue preemption stopped the running ticket: give its slot back without
        ending it. It waits in its queue again (not ``running``); the future resolves
        with its next verdict (cancelled if the scheduler dropped it)."""
        ticket = self.ticket
        # Wait first: giving the slot back may admit the ticket again at once.
        waiting = self._driver.requeue_wait(ticket.id)
        usage = Usage(ticket.prompt_tokens, generated, feedback=Feedback.IGNORE)
        self._driver.complete(ticket.id, usage)
        self.running = False
        return waiting

    @property
    def refused(self) -> bool:
        """Whether the scheduler refused the ticket (a rejection, an expiry, a shed)."""
        return self.outcome in _REFUSALS

    # Not coroutines themselves: they hand back the sink's, one frame less per answer.
    def reply(
        self,
        status: int,
        body: bytes,
        *,
        events: bool = False,
        preempted: bool = False,
        retry_after_s: float | None = None,
    ) -> Awaitable[None]:
        """Answer the admitted request with a whole ``body`` (kept as ``answered``); await
        the result."""
        assert self.admit is not None
        reply = Reply(
            status, body, self.admit.queued_s, self.ticket.lane, events, preempted, retry_after_s
        )
        self.answered = reply
        return self.sink.answer(reply)

    def open_stream(self) -> Awaitable[None]:
        """Start the admitted request's event stream; await the result."""
        assert self.admit is not None
        self.streamed = True
        return self.sink.open_stream(self.admit.queued_s, self.ticket.lane)
