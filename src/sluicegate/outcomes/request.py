"""One request of a workload, as the simulator and the load generator replay it."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class WorkloadRequest:
    """A request to replay.

    Attributes:
        arrival_s: arrival time in seconds from the start of the workload.
        prompt_tokens: prompt length.
        output_tokens: the true output length (what the engine will generate).
        max_tokens: the client's cap (≥ output_tokens).
        tenant: who sends it.
        lane: the lane it is classified into.
        priority: 0 (critical) … 5 (background).
        deadline_ms: optional per-request deadline relative to arrival; ``None``
            means the lane's SLO.
    """

    arrival_s: float
    prompt_tokens: int
    output_tokens: int
    max_tokens: int
    tenant: str = "default"
    lane: str = "interactive"
    priority: int = 2
    deadline_ms: float | None = None
