"""The driver's mutable record of one request while a simulation runs."""

from __future__ import annotations

from sluicegate.core.ticket import TicketId
from sluicegate.outcomes import RequestOutcome, WorkloadRequest


class SimRequest:
    """One request from arrival until it ends; ``record`` freezes it into a ``RequestOutcome``.

    ``eid`` is the request's id inside the engine: the ticket id, suffixed on
    a re-run after a requeue so a stale in-flight step of the earlier run can
    never be mistaken for the new one. ``block_hashes`` are the prompt's full engine
    KV blocks (the workload's ``prefix`` in engine blocks, ``sim/workloads/trace_blocks``):
    what the engine caches and the ticket carries.
    """

    __slots__ = ("admit_s", "admitted_s", "backend", "block_hashes", "eid", "finish_s",
                 "first_token_s", "generated", "index", "outcome", "requeues", "runs", "target",
                 "ticket_id", "workload")  # fmt: skip

    def __init__(
        self, index: int, workload: WorkloadRequest, block_hashes: tuple[int, ...] = ()
    ) -> None:
        self.index = index
        self.workload = workload
        self.block_hashes = block_hashes
        self.ticket_id = TicketId(str(index))
        self.target = max(1, min(workload.max_tokens, workload.output_tokens))
        self.eid: str = self.ticket_id
        self.outcome = ""
        self.admit_s: float | None = None
        self.admitted_s = 0.0
        self.first_token_s: float | None = None
        self.finish_s: float | None = None
        self.backend: str | None = None
        self.generated = self.requeues = self.runs = 0

    def end(self, outcome: str, now: float) -> None:
        """The request ended with ``outcome`` at ``now``."""
        self.outcome = outcome
        self.finish_s = now

    def record(self, lane_slo_s: float) -> RequestOutcome:
        """The frozen record; ``lane_slo_s`` gives the deadline when the request has none."""
        wl = self.workload
        own = wl.deadline_ms
        return RequestOutcome(
            index=self.index,
            tenant=wl.tenant,
            lane=wl.lane,
            priority=wl.priority,
            outcome=self.outcome,
            arrival_s=wl.arrival_s,
            admit_s=self.admit_s,
            first_token_s=self.first_token_s,
            finish_s=self.finish_s,
            deadline_s=wl.arrival_s + (lane_slo_s if own is None else own / 1000.0),
            prompt_tokens=wl.prompt_tokens,
            output_tokens=self.target,
            generated_tokens=self.generated,
            replica=self.backend,
            requeues=self.requeues,
        )
