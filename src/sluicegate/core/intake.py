"""A ticket's bookkeeping on the way in and what its end teaches.

``refuse_early`` refuses a ticket before anything is set up for it (draining,
store closed, no healthy backend, rate limit), charging nothing; ``refuse_bounced``
ends one whose backend refused its connection, if it may not wait again; ``new_entry``
derives what the scheduler keeps about a new ticket; ``offer`` is
what distributed mode sends the store about a queued one; ``learn`` feeds a
finished request to the model's predictor and adaptive limit.
"""

from __future__ import annotations

from sluicegate.core.decisions import ErrorCode, Expire, Reject, Reserve
from sluicegate.core.entry import Entry
from sluicegate.core.fair_queue import VTC_INPUT_WEIGHT, VTC_OUTPUT_WEIGHT
from sluicegate.core.limits.feedback import report_outcome
from sluicegate.core.ratelimit import TenantRateLimiter
from sluicegate.core.retry import retry_wait_s
from sluicegate.core.runtime import LaneRuntime, ModelRuntime
from sluicegate.core.ticket import Feedback, Ticket, Usage


def new_entry(
    model: ModelRuntime, lane: LaneRuntime, ticket: Ticket, now: float, *, seq: int, shared: bool
) -> Entry:
    """The scheduler's bookkeeping for a ticket that just arrived: its predicted service,
    deadline, token costs and when it leaves the queue (queue timeout, or its latest start
    in a shedding lane). ``shared``: distributed mode, where the store charges the
    tenant's rate limits (nothing is charged locally, so nothing is refunded)."""
    predictor = model.predictor
    units = ticket.units
    predicted = ticket.predicted_output_tokens
    if predicted is None:
        # Per choice: ``units`` choices share ``max_tokens`` and decode side by side.
        each = predictor.predict_output(ticket.lane, max(1, ticket.max_tokens // units))
        predicted = units * each
    prefill_s = predictor.prefill_s(ticket.prompt_tokens)
    per_token_s = predictor.decode_s_per_token()
    deadline = ticket.deadline
    if deadline is None:
        deadline = ticket.arrival + lane.spec.slo_ms / 1000.0
    service_s = prefill_s + predicted / units * per_token_s
    expire_at = now + lane.spec.queue_timeout_s
    # A shedding lane never runs a ticket that can no longer meet its deadline: later
    # arrivals that overtake it (tighter deadlines) would make it late and waste the slot.
    latest_start = deadline - service_s
    hopeless_first = lane.spec.shed_hopeless and latest_start < expire_at
    return Entry(
        ticket=ticket,
        seq=seq,
        deadline=deadline,
        predicted_output_tokens=predicted,
        prefill_s=prefill_s,
        decode_s_per_token=per_token_s,
        service_s=service_s,
        cost_tokens=ticket.prompt_tokens + predicted,
        expire_at=latest_start if hopeless_first else expire_at,
        expires_hopeless=hopeless_first,
        # Charged by the store in distributed mode: the driver refunds it there.
        charged_tokens=0 if shared else ticket.prompt_tokens + ticket.max_tokens,
    )


def offer(lane: LaneRuntime, entry: Entry) -> Reserve:
    """The ``Reserve`` offering queued ``entry`` of ``lane`` to the shared store."""
    ticket = entry.ticket
    charge = (
        VTC_INPUT_WEIGHT * ticket.prompt_tokens + VTC_OUTPUT_WEIGHT * entry.predicted_output_tokens
    )
    return Reserve(ticket, lane.order(entry), entry.cost_tokens, charge)


def learn(model: ModelRuntime, entry: Entry, usage: Usage, now: float) -> None:
    """Feed a finished, not preempted, request to the predictor and the limit.

    The predictor learns only from answers the engine gave in full (``Feedback.SAMPLE``):
    a client's 4xx, a disconnect or an engine's 429 says nothing about output lengths.
    A ticket of several units (``n`` choices) teaches what one choice did: its share
    of ``max_tokens`` and of the tokens generated, in the time they took side by side.
    """
    ticket = entry.ticket
    units = ticket.units
    if units > 1:
        usage = Usage(
            usage.prompt_tokens,
            usage.completion_tokens // units,
            ttft_s=usage.ttft_s,
            ok=usage.ok,
            feedback=usage.feedback,
        )
    if usage.limit_feedback is Feedback.SAMPLE:
        model.predictor.observe(
            lane=ticket.lane,
            max_tokens=max(1, ticket.max_tokens // units),
            prompt_tokens=usage.prompt_tokens,
            completion_tokens=usage.completion_tokens,
            ttft_s=usage.ttft_s,
            duration_s=now - entry.admitted_at,
        )
    if model.limit is not None:
        report_outcome(
            model.limit, usage, elapsed_s=now - entry.admitted_at, inflight=model.running + units
        )


def refuse_early(
    model: ModelRuntime,
    ticket: Ticket,
    now: float,
    *,
    draining: bool,
    closed: bool,
    rate: TenantRateLimiter | None,
) -> Reject | None:
    """Why ``ticket`` is refused before it is queued, or ``None``: the gateway drains, the
    shared store is down and the gateway fails closed, no backend is healthy (unless the
    model waits for backends, e.g. scaling from zero: then it queues), or its
    tenant's rate limit (``rate``; ``None`` when the store charged it) is exhausted.

    A check only: it charges nothing (``Scheduler.submit`` charges the rate limit)."""
    if draining:
        return reject(ticket, 503, ErrorCode.DRAINING, 5.0, "gateway is draining")
    if closed:
        message = "the shared store is unavailable"
        return reject(ticket, 503, ErrorCode.STORE_UNAVAILABLE, 1.0, message)
    if not model.spec.wait_for_backends and not model.any_healthy(now):
        wait = model.unavailable_wait_s(now)
        return reject(ticket, 503, ErrorCode.NO_HEALTHY_BACKEND, wait, "no healthy backend")
    if rate is None:
        return None
    wait = rate.wait_time(ticket.tenant, ticket.prompt_tokens + ticket.max_tokens, now)
    if wait > 0.0:
        message = "tenant rate limit exceeded"
        return reject(ticket, 429, ErrorCode.RATE_LIMIT_EXCEEDED, wait, message)
    return None


def refuse_lane(
    model: ModelRuntime, lane: LaneRuntime, ticket: Ticket, pressure_retry_s: float
) -> Reject | None:
    """Why ``ticket``, past ``refuse_early``, may not join ``lane``'s queue, or ``None``:
    cluster pressure closed the lane (503 ``overloaded``, retry after ``pressure_retry_s``)
    or its queue is full (429 ``queue_full``) and the lane has no room to admit at once."""
    if lane.ceiling == 0:
        message = f"cluster under pressure: lane {lane.spec.name!r} admits nothing for now"
        return reject(ticket, 503, ErrorCode.OVERLOADED, pressure_retry_s, message)
    queue = lane.queue
    if len(queue) >= lane.spec.max_queue and not (len(queue) == 0 and model.lane_has_room(lane)):
        # Not the ticket's own start estimate: a full queue refills as fast as it
        # drains under overload, so a retry helps only once the whole lane drained.
        drain = model.drain_estimate_s(lane)
        return reject(ticket, 429, ErrorCode.QUEUE_FULL, drain, "queue is full")
    return None


def refuse_bounced(model: ModelRuntime, entry: Entry, now: float) -> Expire | None:
    """Why a ticket whose backend refused its connection may not queue again, or ``None``.

    It may while its expiry (queue timeout, or latest start in a shedding lane) has not
    passed, and, unless the model waits for backends, while a backend is healthy and it
    has bounced off at most as many backends as the model has. A waiting room holds it
    as it holds a new request, until its queue timeout: each backend's circuit
    cool-down paces its tries there.
    """
    ticket = entry.ticket
    healthy = model.any_healthy(now)
    if healthy:
        wait = model.drain_estimate_s(model.lanes[ticket.lane])
    else:
        wait = model.unavailable_wait_s(now)
    if now >= entry.expire_at:
        code = ErrorCode.OVERLOADED if entry.expires_hopeless else ErrorCode.QUEUE_TIMEOUT
        return Expire(ticket, retry_wait_s(wait), code)
    if not model.spec.wait_for_backends and (entry.bounces > len(model.backends) or not healthy):
        return Expire(ticket, retry_wait_s(wait), ErrorCode.NO_HEALTHY_BACKEND)
    return None


def reject(ticket: Ticket, status: int, code: ErrorCode, wait_s: float, message: str) -> Reject:
    """A ``Reject`` whose retry-after is ``wait_s`` rounded as clients are told it."""
    return Reject(ticket, status, code, retry_wait_s(wait_s), message)
