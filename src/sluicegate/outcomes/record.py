"""How one request ended: the record every summary reads, from the simulator or the load generator.

All times are seconds on the clock of the driver that produced the record (virtual
time in the simulator, the generator's monotonic clock in ``sluicegate bench``), so
only differences between them mean anything. The latencies are defined here, once:

* **queue wait** = admission − arrival, for a request that was admitted (any outcome);
* **TTFT** = first token − arrival and **end-to-end** = finish − arrival, for a
  request that completed.
"""

from __future__ import annotations

from dataclasses import dataclass

COMPLETED = "completed"
"""``outcome`` of a request that was served in full (``core.ticket.Outcome.COMPLETED``'s value)."""


@dataclass(frozen=True, slots=True)
class RequestOutcome:
    """One request's fate.

    Attributes:
        index: position in the workload as given.
        tenant: who sent it.
        lane: its lane.
        priority: 0 (critical) … 5 (background).
        outcome: ``COMPLETED``, or why it did not complete: an ``Outcome`` value or
            ``"too_large"`` in the simulator, an error code for the load generator.
        arrival_s: when it arrived (for the load generator: when it was sent).
        admit_s: its first admission by the scheduler, if known and admitted.
        first_token_s: the first token of the run that completed, if any.
        finish_s: when it ended, whatever the outcome.
        deadline_s: when it had to be finished by: its own deadline, else arrival + its
            lane's SLO; ``None`` when it had neither.
        prompt_tokens: prompt length.
        output_tokens: the output it was to produce (the simulator's true length; the
            load generator's ``max_tokens``).
        generated_tokens: output tokens it actually produced before it ended.
        replica: the replica of its last run, if it ran and the driver knows it.
        requeues: times it was preempted and put back in its queue (0 if unknown).
    """

    index: int
    tenant: str
    lane: str
    priority: int
    outcome: str
    arrival_s: float
    admit_s: float | None
    first_token_s: float | None
    finish_s: float | None
    deadline_s: float | None
    prompt_tokens: int
    output_tokens: int
    generated_tokens: int
    replica: str | None
    requeues: int

    @property
    def good(self) -> bool:
        """Whether it completed within its deadline (any completion, without a deadline)."""
        finish = self.finish_s
        if self.outcome != COMPLETED or finish is None:
            return False
        return self.deadline_s is None or finish <= self.deadline_s

    @property
    def queue_wait_s(self) -> float | None:
        """Admission − arrival; ``None`` if it was never admitted (or the driver cannot tell)."""
        return None if self.admit_s is None else self.admit_s - self.arrival_s

    @property
    def ttft_s(self) -> float | None:
        """First token − arrival; ``None`` unless it completed with a first token."""
        if self.outcome != COMPLETED or self.first_token_s is None:
            return None
        return self.first_token_s - self.arrival_s

    @property
    def e2e_s(self) -> float | None:
        """Finish − arrival; ``None`` unless it completed."""
        if self.outcome != COMPLETED or self.finish_s is None:
            return None
        return self.finish_s - self.arrival_s
