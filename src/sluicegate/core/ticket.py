"""The scheduler's record of one request, and what the driver reports about it."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import NewType

TicketId = NewType("TicketId", str)

MIN_PRIORITY = 0
MAX_PRIORITY = 5


@dataclass(frozen=True, slots=True)
class Ticket:
    """One request as the scheduler sees it; immutable once submitted.

    Attributes:
        id: unique across the scheduler (and across replicas in distributed mode).
        model: the configured model name the request asks for.
        tenant: who pays; decides rate limits and fair share.
        lane: the lane (traffic class) the request was classified into.
        priority: 0 (critical) … 5 (background); decides the preemption tier.
        prompt_tokens: estimated prompt size.
        max_tokens: the client's output cap.
        arrival: time the request arrived, in the driver's clock.
        deadline: absolute time by which it should finish; ``None`` means the
            lane's SLO from arrival.
        predicted_output_tokens: a driver-supplied prediction; ``None`` lets the
            scheduler's predictor decide.
        true_output_tokens: the real output length, known only in simulation
            (for the ``oracle`` policy).
        prefix_key: a hash of the leading prompt text, for prefix-affinity routing.
        block_hashes: the prompt's KV block hashes (``core/prefix_blocks``), for
            precise prefix routing; empty when not computed.
        streaming: whether the client streams (a streamed request can't be
            transparently re-run after preemption).
        units: engine sequences the request runs at once (its ``n`` choices): it
            takes that many units of every concurrency count (model, lane, backend,
            tenant share), and ``max_tokens`` covers all of them.
    """

    id: TicketId
    model: str
    tenant: str
    lane: str
    priority: int
    prompt_tokens: int
    max_tokens: int
    arrival: float
    deadline: float | None = None
    predicted_output_tokens: int | None = None
    true_output_tokens: int | None = None
    prefix_key: int | None = None
    block_hashes: tuple[int, ...] = ()
    streaming: bool = False
    units: int = 1

    def __post_init__(self) -> None:
        if not MIN_PRIORITY <= self.priority <= MAX_PRIORITY:
            raise ValueError(
                f"priority must be in [{MIN_PRIORITY}, {MAX_PRIORITY}], got {self.priority}"
            )
        if self.prompt_tokens < 0:
            raise ValueError(f"prompt_tokens must be >= 0, got {self.prompt_tokens}")
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {self.max_tokens}")
        if self.units < 1:
            raise ValueError(f"units must be >= 1, got {self.units}")


class Outcome(enum.Enum):
    """How a ticket ended; the values double as the ``outcome`` metric label."""

    COMPLETED = "completed"
    REJECTED_RATE_LIMIT = "rejected_rate_limit"
    REJECTED_QUEUE_FULL = "rejected_queue_full"
    REJECTED_UNAVAILABLE = "rejected_unavailable"
    EXPIRED = "expired"
    SHED = "shed"
    CANCELLED = "cancelled"
    PREEMPTED = "preempted"
    UPSTREAM_ERROR = "upstream_error"
    INTERNAL_ERROR = "internal_error"


class Feedback(enum.Enum):
    """What a finished request tells its model's adaptive limit about engine load."""

    SAMPLE = "sample"
    """The engine answered: the request's latency is a sample."""
    DROP = "drop"
    """The engine failed, timed out, or refused the request for load (429, 503)."""
    IGNORE = "ignore"
    """Nothing: the client's own mistake (4xx), a disconnect, or a preemption."""


@dataclass(frozen=True, slots=True)
class Usage:
    """What a finished request really consumed, reported by the driver.

    Attributes:
        prompt_tokens: real prompt tokens (from the engine's ``usage``), or the estimate.
        completion_tokens: tokens generated.
        ttft_s: time from admission to the first token, if observed.
        ok: ``False`` when the upstream failed; the backend's circuit counts it.
            ``None`` when the request says nothing of the engine (the gateway's own
            fault): the circuit is left as it was.
        feedback: what the adaptive limit learns; ``None`` means ``SAMPLE`` if
            ``ok``, ``DROP`` if ``ok`` is ``False`` and ``IGNORE`` if it is ``None``
            (see ``limit_feedback``).
    """

    prompt_tokens: int
    completion_tokens: int
    ttft_s: float | None = None
    ok: bool | None = True
    feedback: Feedback | None = None

    @property
    def limit_feedback(self) -> Feedback:
        """``feedback`` if given, else ``SAMPLE`` for a success, ``DROP`` for a failure and
        ``IGNORE`` for a request that says nothing of the engine."""
        if self.feedback is not None:
            return self.feedback
        if self.ok is None:
            return Feedback.IGNORE
        return Feedback.SAMPLE if self.ok else Feedback.DROP


@dataclass(frozen=True, slots=True)
class BackendStats:
    """One observation of a backend: active health probe and/or scraped engine metrics.

    Any field left ``None`` is unknown and leaves the previous value in place.
    ``kv_capacity_tokens`` is the engine's KV-cache size in tokens (for an
    ``auto`` in-flight token budget). ``scraped``: the observation carries a good
    metrics scrape, which restarts the backend's staleness clock.
    """

    model: str
    backend: str
    healthy: bool | None = None
    kv_cache_usage: float | None = None
    num_requests_running: int | None = None
    num_requests_waiting: int | None = None
    kv_capacity_tokens: int | None = None
    scraped: bool = False
