"""What the scheduler tells its driver to do: plain data, executed by the driver.

Decisions are immutable named tuples: one is built per event on the hot path,
where they cost a third of a frozen dataclass (benchmarks/bench_core.py).

Rejections before a ticket is queued (``Reject``) and removals after
(``Expire``, ``Preempt``) are separate families, as in the Gateway API
Inference Extension's flow control.
"""

from __future__ import annotations

import enum
from typing import NamedTuple

from sluicegate.core.ticket import Outcome, Ticket


class ErrorCode(enum.Enum):
    """Error codes the gateway puts in OpenAI's error shape."""

    RATE_LIMIT_EXCEEDED = "rate_limit_exceeded"
    QUEUE_FULL = "queue_full"
    QUEUE_TIMEOUT = "queue_timeout"
    OVERLOADED = "overloaded"
    DRAINING = "draining"
    NO_HEALTHY_BACKEND = "no_healthy_backend"
    STORE_UNAVAILABLE = "store_unavailable"


class PreemptAction(enum.Enum):
    """What happens to a preempted request."""

    ABORT = "abort"
    REQUEUE = "requeue"


class Admit(NamedTuple):
    """Run ``ticket`` on ``backend`` now; it holds a slot until ``complete``."""

    ticket: Ticket
    backend: str
    queued_s: float


class Queued(NamedTuple):
    """The ticket waits in its lane's queue; a later decision admits or removes it.

    ``estimated_wait_s`` is the estimated time from now until it starts: the work
    its lane's policy runs before it over the lane's slots (``core/work_ahead.py``).
    Only lanes with ``shed_hopeless`` keep what it needs; elsewhere it is ``None``.
    """

    ticket: Ticket
    estimated_wait_s: float | None


class Reject(NamedTuple):
    """Refuse the ticket before it is queued (HTTP ``status`` with ``retry_after_s``)."""

    ticket: Ticket
    status: int
    code: ErrorCode
    retry_after_s: float
    message: str

    @property
    def outcome(self) -> Outcome:
        """The metric outcome of this rejection."""
        return _REJECT_OUTCOMES[self.code]


class Expire(NamedTuple):
    """Remove a queued ticket that can no longer be served in time.

    ``code`` says why: ``QUEUE_TIMEOUT`` (HTTP 503 ``queue_timeout``) when its
    queue timeout passed; ``OVERLOADED`` (HTTP 503 ``overloaded``) when, in a
    lane with ``shed_hopeless``, its latest start (deadline − predicted
    service) passed while it waited; ``STORE_UNAVAILABLE`` (HTTP 503) when the
    shared store failed and the gateway fails closed. A running ticket whose
    backend refused its connection (``Scheduler.bounce``) is expired so too, or
    with ``NO_HEALTHY_BACKEND`` (HTTP 503) when no backend is left to try.
    """

    ticket: Ticket
    retry_after_s: float
    code: ErrorCode = ErrorCode.QUEUE_TIMEOUT

    @property
    def outcome(self) -> Outcome:
        """The metric outcome of this removal (``expired``, or ``shed`` for a hopeless one)."""
        return _REJECT_OUTCOMES[self.code]


class Preempt(NamedTuple):
    """Stop a running ticket to free its slot.

    The ticket keeps its slot until the driver has closed the upstream request
    and calls ``complete``; then ``action`` applies: ``ABORT`` ends it with
    outcome ``preempted``, ``REQUEUE`` puts it back in its queue.
    """

    ticket: Ticket
    backend: str
    action: PreemptAction


class Reserve(NamedTuple):
    """Distributed mode: offer the queued ``ticket`` to the shared store's waiting set.

    The ticket stays queued here; the store grants it a global slot when it is
    the best waiting ticket anywhere, and the driver answers with
    ``Scheduler.grant`` (which yields ``Admit``). ``order`` is the lane
    ordering's key (compared across replicas), ``cost_tokens`` its share of the
    token budget and ``vtc_charge`` what admission adds to its tenant's virtual
    token counter before division by the weight. ``urgent_at`` is when it becomes
    entitled to preempt (``None``: never) and ``preempt_delay_s`` how long after its
    admission it may itself be preempted (``None``: never): the store's preemption
    across replicas follows ``core/preemption.py``'s rules with them. ``share_from``
    (lanes with tenant shares only) is when its tenant may have a slot given back to it
    (``preempt_after_ms`` after it queued, or at once).
    """

    ticket: Ticket
    order: tuple[float, ...]
    cost_tokens: int
    vtc_charge: float
    urgent_at: float | None = None
    preempt_delay_s: float | None = None
    share_from: float | None = None


Decision = Admit | Queued | Reject | Expire | Preempt | Reserve

_REJECT_OUTCOMES = {
    ErrorCode.RATE_LIMIT_EXCEEDED: Outcome.REJECTED_RATE_LIMIT,
    ErrorCode.QUEUE_FULL: Outcome.REJECTED_QUEUE_FULL,
    ErrorCode.OVERLOADED: Outcome.SHED,
    ErrorCode.DRAINING: Outcome.REJECTED_UNAVAILABLE,
    ErrorCode.NO_HEALTHY_BACKEND: Outcome.REJECTED_UNAVAILABLE,
    ErrorCode.QUEUE_TIMEOUT: Outcome.EXPIRED,
    ErrorCode.STORE_UNAVAILABLE: Outcome.REJECTED_UNAVAILABLE,
}
