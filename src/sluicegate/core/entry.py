"""The scheduler's mutable bookkeeping for one ticket while it is alive."""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass

from sluicegate.core.ticket import Ticket


class State(enum.Enum):
    """Where a live ticket is."""

    QUEUED = "queued"
    RUNNING = "running"
    PREEMPTING = "preempting"


@dataclass(slots=True, eq=False)
class Entry:
    """A live ticket plus what the scheduler derived and observed about it.

    Attributes:
        ticket: the immutable request.
        seq: submission order; the last tie-breaker of every queue key.
        deadline: absolute deadline (the ticket's, or arrival + lane SLO).
        predicted_output_tokens: the predictor's (or the driver's) estimate.
        prefill_s: predicted time to first token once running.
        decode_s_per_token: predicted time per output token.
        service_s: ``prefill_s + predicted_output_tokens · decode_s_per_token``.
        cost_tokens: what the ticket charges the model's in-flight token budget.
        state: queued, running, or being preempted.
        queue_gen: bumped on every push, so stale heap items are recognised.
        queue_item: while queued, its item in the queue (key, seq, entry); stale after a pop.
        run_end: while running, its predicted end as its lane counts it (NaN otherwise).
        enqueued_at: when it (last) entered a queue.
        admitted_at: when it (last) took a slot.
        backend: the backend it runs on.
        borrowed: whether its slot is borrowed from another lane.
        generated_tokens: progress reported by the driver.
        requeues: how many times it was preempted and put back.
        bounces: how many backends refused its connection (``Scheduler.bounce``).
        preempt_requeue: set on a ``Preempt`` decision whose action is requeue.
        preempted_for: the lane whose waiting ticket a preemption frees a slot for.
        expire_at: when it leaves the queue: its queue timeout or, in a lane with
            ``shed_hopeless``, its latest start if that comes first.
        expires_hopeless: whether ``expire_at`` is the latest start.
        charged_tokens: tokens taken from the tenant's rate limit, to refund on release.
        prefill_tokens: while running without a first token, its uncached prompt tokens
            counted in its backend's ``prefill_backlog_tokens`` (0 otherwise).
        prefill_ahead: the backend's backlog at its dispatch plus its own uncached tokens:
            what its time to first token teaches the backend's prefill rate.
    """

    ticket: Ticket
    seq: int
    deadline: float
    predicted_output_tokens: int
    prefill_s: float
    decode_s_per_token: float
    service_s: float
    cost_tokens: int
    state: State = State.QUEUED
    queue_gen: int = 0
    queue_item: tuple[float | int | Entry, ...] | None = None
    run_end: float = math.nan
    enqueued_at: float = 0.0
    admitted_at: float = 0.0
    backend: str = ""
    borrowed: bool = False
    generated_tokens: int = 0
    requeues: int = 0
    bounces: int = 0
    preempt_requeue: bool = False
    preempted_for: str | None = None
    expire_at: float = 0.0
    expires_hopeless: bool = False
    charged_tokens: int = 0
    prefill_tokens: int = 0
    prefill_ahead: int = 0

    def __lt__(self, other: Entry) -> bool:
        """Submission order, so an entry may close a heap item (seq is unique: never reached)."""
        return self.seq < other.seq
