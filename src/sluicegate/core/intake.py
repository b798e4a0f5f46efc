"""A ticket's way in, and the refusals of a ticket already in that may not wait on.

``arrive`` takes a new ticket in, in one step that returns its verdict: the refusals
before anything is set up for it (``refuse_early``: draining, store closed, no healthy
backend, rate limit; a check only, it charges nothing), its ``Entry`` (``new_entry``),
the refusals of its lane (``refuse_lane``: cluster pressure, a full queue; a hopeless
deadline in a shedding lane, from its start estimate), and the rate limit's one charge.
``offer`` is what distributed mode sends the store about a queued ticket.

A ticket already in leaves unserved by ``refuse_bounced`` (its backend refused its
connection and it may not queue again) or ``expire`` (it waited past its expiry).
Everything here returns its decision; the ``Scheduler`` registers, queues and ends
tickets.
"""

from __future__ import annotations

import math

from sluicegate.core.backend_state import any_healthy, unavailable_wait_s
from sluicegate.core.decisions import ErrorCode, Expire, Reject, Reserve
from sluicegate.core.entry import Entry
from sluicegate.core.estimate import start_estimate
from sluicegate.core.fair_queue import VTC_INPUT_WEIGHT, VTC_OUTPUT_WEIGHT
from sluicegate.core.preemption import preemptible_after, share_grace_end, urgent_time
from sluicegate.core.ratelimit import TenantRateLimiter
from sluicegate.core.retry import retry_wait_s
from sluicegate.core.runtime import LaneRuntime, ModelRuntime
from sluicegate.core.ticket import Ticket

Arrival = tuple[Entry | None, Reject | None, float | None]
"""What ``arrive`` made of a new ticket: its entry (``None`` when ``refuse_early`` refused
it: nothing was set up or charged, and it took no submission number), why it may not
queue (``None``: it queues, or runs, now), and its start estimate in a lane that sheds
(what ``Queued`` reports; else ``None``). A plain tuple: one is built per submit."""


def arrive(
    model: ModelRuntime,
    lane: LaneRuntime,
    ticket: Ticket,
    now: float,
    *,
    seq: int,
    shared: bool,
    draining: bool,
    closed: bool,
    rate: TenantRateLimiter | None,
    pressure_retry_s: float,
) -> Arrival:
    """Take ``ticket`` in for ``lane``: refuse it, or make its entry (submission number
    ``seq``) ready to queue; charge ``rate`` (``None`` when the store charged it).

    The refusals come in this order: ``refuse_early``, then ``refuse_lane``, then, in a
    lane that sheds, a deadline its start estimate says cannot be met (503 ``overloaded``).
    ``rate`` is charged once, past ``refuse_early``: the request even if refused after
    it, its tokens only if it queues.
    """
    refusal = refuse_early(model, ticket, now, draining=draining, closed=closed, rate=rate)
    if refusal is not None:
        return None, refusal, None
    entry = new_entry(model, lane, ticket, now, seq=seq, shared=shared)
    refusal = refuse_lane(model, lane, ticket, pressure_retry_s)
    # The start estimate, in lanes that keep it: what sheds, and what ``Queued`` reports
    # (a dispatch only moves work ahead of the ticket from queued to running).
    wait: float | None = None
    if refusal is None and lane.spec.shed_hopeless:
        wait = start_estimate(model, lane, entry, now)
        if now + wait + entry.service_s > entry.deadline:
            refusal = reject(ticket, 503, ErrorCode.OVERLOADED, wait, "deadline cannot be met")
    if rate is not None:
        rate.charge(ticket.tenant, 0 if refusal is not None else entry.charged_tokens, now)
    return entry, refusal, wait


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


def offer(model: ModelRuntime, lane: LaneRuntime, entry: Entry) -> Reserve:
    """The ``Reserve`` offering queued ``entry`` of ``lane`` to the shared store."""
    ticket = entry.ticket
    charge = (
        VTC_INPUT_WEIGHT * ticket.prompt_tokens + VTC_OUTPUT_WEIGHT * entry.predicted_output_tokens
    )
    return Reserve(
        ticket,
        lane.order(entry),
        entry.cost_tokens,
        charge,
        _finite(urgent_time(model, lane.spec, entry)) if model.has_victims else None,
        preemptible_after(lane.spec, entry),
        share_grace_end(lane, entry),
    )


def _finite(value: float) -> float | None:
    return value if math.isfinite(value) else None


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

    A check only: it charges nothing (``arrive`` charges the rate limit)."""
    if draining:
        return reject(ticket, 503, ErrorCode.DRAINING, 5.0, "gateway is draining")
    if closed:
        message = "the shared store is unavailable"
        return reject(ticket, 503, ErrorCode.STORE_UNAVAILABLE, 1.0, message)
    if not model.spec.wait_for_backends and not any_healthy(model.backends, now):
        wait = unavailable_wait_s(model.backends, now)
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
    healthy = any_healthy(model.backends, now)
    if healthy:
        wait = model.drain_estimate_s(model.lanes[ticket.lane])
    else:
        wait = unavailable_wait_s(model.backends, now)
    if now >= entry.expire_at:
        code = ErrorCode.OVERLOADED if entry.expires_hopeless else ErrorCode.QUEUE_TIMEOUT
        return Expire(ticket, retry_wait_s(wait), code)
    if not model.spec.wait_for_backends and (entry.bounces > len(model.backends) or not healthy):
        return Expire(ticket, retry_wait_s(wait), ErrorCode.NO_HEALTHY_BACKEND)
    return None


def expire(model: ModelRuntime, lane: LaneRuntime, entry: Entry, now: float) -> Expire:
    """Take queued ``entry``, past its expiry, out of ``lane``'s queue and say why it leaves.

    503 ``overloaded`` at its latest start in a shedding lane, else ``queue_timeout``. The
    retry hint: with work tracked, when the work that was ahead of it has run (where it
    stood, it would have started); else the lane's whole drain, once it left; and while
    no backend is healthy (a waiting room whose engines never came), at least until one
    may be.
    """
    wait = start_estimate(model, lane, entry, now) if lane.spec.shed_hopeless else None
    lane.queue.remove(entry)
    if wait is None:
        wait = model.drain_estimate_s(lane)
    if not any_healthy(model.backends, now):
        wait = max(wait, unavailable_wait_s(model.backends, now))
    code = ErrorCode.OVERLOADED if entry.expires_hopeless else ErrorCode.QUEUE_TIMEOUT
    return Expire(entry.ticket, retry_wait_s(wait), code)


def reject(ticket: Ticket, status: int, code: ErrorCode, wait_s: float, message: str) -> Reject:
    """A ``Reject`` whose retry-after is ``wait_s`` rounded as clients are told it."""
    return Reject(ticket, status, code, retry_wait_s(wait_s), message)
