"""The scheduler: a sans-I/O state machine that decides whether, when and where requests run.

A driver (the gateway in real time, the simulator in virtual time) feeds it
events, each with a timestamp, and executes the decisions it returns::

    submit(ticket, now)            -> [Admit | Queued | Reject, Preempt...]
    complete(id, usage, now)       -> [Admit..., Preempt...]
    cancel(id, now)                -> [Admit...]
    tick(now)                      -> [Expire..., Admit..., Preempt...]
    observe_backend(stats, now)    -> [Admit...]
    grant(id, now) / deny(...)     -> distributed mode answers to ``Reserve``
    next_wakeup()                  -> when to call ``tick`` next

Nothing here reads a clock, sleeps or does I/O, so the same code runs in the
gateway and the simulator.

This module is the entry point: each event updates the ticket's bookkeeping,
then runs one *dispatch* for the model concerned — ``admission.admit_waiting``
grants free capacity to waiting tickets, then ``preemption.preempt_for_blocked``
stops running tickets for urgent ones. The live counts they share (slots,
budgets, backends) and their accounting live in ``runtime``.
"""

from __future__ import annotations

import heapq

from sluicegate.core.admission import admit_waiting
from sluicegate.core.decisions import Admit, Decision, ErrorCode, Expire, Queued, Reject
from sluicegate.core.entry import Entry, State
from sluicegate.core.errors import UnknownModelError
from sluicegate.core.estimate import start_estimate
from sluicegate.core.limits.feedback import report_outcome
from sluicegate.core.preemption import preempt_for_blocked
from sluicegate.core.ratelimit import TenantRateLimiter
from sluicegate.core.retry import retry_wait_s
from sluicegate.core.runtime import LaneRuntime, ModelRuntime
from sluicegate.core.spec import SchedulerSpec
from sluicegate.core.ticket import BackendStats, Feedback, Ticket, TicketId, Usage
from sluicegate.core.views import LaneView, ModelView, view_model


class Scheduler:
    """Admission control, queueing, preemption and routing for every configured model.

    Invariants (checked by the property tests): a lane's own running count
    never exceeds its cap; a model never admits above its effective cap or
    token budget; every submitted ticket ends exactly once (completed,
    rejected, expired, cancelled or preempted); with no live tickets, every
    count is zero and every queue empty.
    """

    def __init__(
        self, spec: SchedulerSpec, *, rate_limiter: TenantRateLimiter | None = None
    ) -> None:
        weights = {tenant.name: tenant.weight for tenant in spec.tenants}
        self.spec = spec
        self._models = {model.name: ModelRuntime(model, weights) for model in spec.models}
        for runtime in self._models.values():
            for lane in runtime.lane_order:
                # Only lanes that decide by it pay for the start estimate's bookkeeping.
                if lane.spec.shed_hopeless:
                    lane.queue.track_work()
        self._rate = rate_limiter if rate_limiter is not None else TenantRateLimiter(spec.tenants)
        self._entries: dict[TicketId, Entry] = {}
        self._expiry: list[tuple[float, int, int, Entry]] = []
        self._seq = 0
        self._global_slots = spec.global_slots
        self.draining = False

    # ------------------------------------------------------------------ events

    def submit(self, ticket: Ticket, now: float) -> list[Decision]:
        """A new request: admit it, queue it or reject it."""
        model = self._model(ticket.model)
        lane = model.lanes.get(ticket.lane)
        if lane is None:
            raise UnknownModelError(f"model {ticket.model!r} has no lane {ticket.lane!r}")
        if ticket.id in self._entries:
            raise ValueError(f"ticket {ticket.id!r} is already live")
        refusal = self._refuse_early(model, ticket, now)
        if refusal is not None:
            return [refusal]
        entry = self._new_entry(model, lane, ticket, now)
        queue = lane.queue
        if len(queue) >= lane.spec.max_queue and not (
            len(queue) == 0 and model.lane_has_room(lane)
        ):
            self._rate.refund(ticket.tenant, entry.charged_tokens, now)
            # Not the ticket's own start estimate: a full queue refills as fast as it
            # drains under overload, so a retry helps only once the whole lane drained.
            drain = model.drain_estimate_s(lane)
            return [self._reject(ticket, 429, ErrorCode.QUEUE_FULL, drain, "queue is full")]
        # The start estimate, in lanes that keep it: what sheds, and what ``Queued`` reports
        # (a dispatch only moves work ahead of the ticket from queued to running).
        wait: float | None = None
        if lane.spec.shed_hopeless:
            wait = start_estimate(model, lane, entry, now)
            if now + wait + entry.service_s > entry.deadline:
                self._rate.refund(ticket.tenant, entry.charged_tokens, now)
                message = "deadline cannot be met"
                return [self._reject(ticket, 503, ErrorCode.OVERLOADED, wait, message)]
        self._entries[ticket.id] = entry
        head_before = queue.peek()
        self._enqueue(lane, entry, now)
        if head_before is not None and model.running >= model.cap() and queue.peek() is head_before:
            # Nothing can be admitted and the lane's head is unchanged, so neither
            # admission nor preemption has anything new to decide.
            return [Queued(ticket, wait)]
        out: list[Decision] = []
        self._dispatch(model, now, out)
        if entry.state is State.QUEUED:
            return [Queued(ticket, wait), *out]
        return out

    def complete(
        self, ticket_id: TicketId, usage: Usage, now: float, *, ran_to_end: bool = False
    ) -> list[Decision]:
        """A running ticket finished (or failed upstream, or was stopped after ``Preempt``).

        Completing an unknown or already-ended ticket is a no-op, so a driver
        may race a completion against a cancellation safely. ``ran_to_end``
        says the engine gave the whole answer: a ``Preempt`` that raced with
        the answer's end stopped nothing, so the ticket ends completed rather
        than preempted (it is not requeued).
        """
        entry = self._entries.get(ticket_id)
        if entry is None:
            return []
        if entry.state is State.QUEUED or entry.state is State.RESERVING:
            raise ValueError(f"ticket {ticket_id!r} is {entry.state.value}, not running")
        model = self._models[entry.ticket.model]
        model.release(entry, usage.completion_tokens)
        backend = model.backend(entry.backend)
        if usage.ok:
            backend.circuit.on_success()
        else:
            backend.circuit.on_failure(now)
        preempted = entry.state is State.PREEMPTING and not ran_to_end
        if not preempted:
            self._learn(model, entry, usage, now)
        out: list[Decision] = []
        if preempted and entry.preempt_requeue:
            # The waiter the slot was freed for goes first; then the victim queues again.
            self._dispatch(model, now, out)
            entry.requeues += 1
            entry.generated_tokens = 0
            self._enqueue(model.lanes[entry.ticket.lane], entry, now)
        else:
            self._end(entry, usage.prompt_tokens + usage.completion_tokens, now)
        self._dispatch(model, now, out)
        return out

    def cancel(self, ticket_id: TicketId, now: float) -> list[Decision]:
        """The client went away: drop the ticket wherever it is. Unknown ids are a no-op."""
        entry = self._entries.get(ticket_id)
        if entry is None:
            return []
        model = self._models[entry.ticket.model]
        lane = model.lanes[entry.ticket.lane]
        if entry.state is State.QUEUED:
            lane.queue.remove(entry)
            self._end(entry, 0, now)
        else:
            model.release(entry, entry.generated_tokens)
            self._end(entry, entry.ticket.prompt_tokens + entry.generated_tokens, now)
        out: list[Decision] = []
        self._dispatch(model, now, out)
        return out

    def progress(self, ticket_id: TicketId, generated_tokens: int) -> None:
        """A running ticket has generated ``generated_tokens`` so far (streaming drivers)."""
        entry = self._entries.get(ticket_id)
        if entry is not None:
            entry.generated_tokens = generated_tokens

    def tick(self, now: float) -> list[Decision]:
        """Time passed: expire overdue tickets, then admit and preempt as needed."""
        out: list[Decision] = []
        touched: set[str] = set()
        expiry = self._expiry
        while expiry and expiry[0][0] <= now:
            _, _, gen, entry = heapq.heappop(expiry)
            if entry.queue_gen != gen or entry.state is not State.QUEUED:
                continue
            model = self._models[entry.ticket.model]
            lane = model.lanes[entry.ticket.lane]
            # With work tracked, retry when the work that was ahead of it has run (where it
            # stood, it would have started); else the lane's whole drain, once it left.
            wait = start_estimate(model, lane, entry, now) if lane.spec.shed_hopeless else None
            lane.queue.remove(entry)
            self._end(entry, 0, now)
            if wait is None:
                wait = model.drain_estimate_s(lane)
            code = ErrorCode.OVERLOADED if entry.expires_hopeless else ErrorCode.QUEUE_TIMEOUT
            out.append(Expire(entry.ticket, retry_wait_s(wait), code))
            touched.add(model.spec.name)
        for name, model in self._models.items():
            if name in touched or (model.wakeup is not None and model.wakeup <= now):
                self._dispatch(model, now, out)
        return out

    def observe_backend(self, stats: BackendStats, now: float) -> list[Decision]:
        """A health probe or metrics scrape of one backend."""
        model = self._model(stats.model)
        backend = model.backend(stats.backend)
        if stats.healthy is not None:
            backend.probe_healthy = stats.healthy
        backend.circuit.advance(now)
        if stats.num_requests_running is not None:
            backend.num_requests_running = stats.num_requests_running
        if stats.num_requests_waiting is not None:
            backend.num_requests_waiting = stats.num_requests_waiting
        if stats.kv_capacity_tokens is not None:
            model.set_kv_capacity(backend.name, stats.kv_capacity_tokens)
        if stats.kv_cache_usage is not None:
            backend.kv_cache_usage = stats.kv_cache_usage
            if model.limit is not None:
                readings = [
                    b.kv_cache_usage for b in model.backends if b.kv_cache_usage is not None
                ]
                model.limit.on_kv_usage(sum(readings) / len(readings), inflight=model.running)
        out: list[Decision] = []
        self._dispatch(model, now, out)
        return out

    def grant(self, ticket_id: TicketId, now: float) -> list[Decision]:
        """Distributed mode: the store granted the global slot a ``Reserve`` asked for."""
        entry = self._entries.get(ticket_id)
        if entry is None or entry.state is not State.RESERVING:
            return []
        entry.state = State.RUNNING
        return [Admit(entry.ticket, entry.backend, now - entry.ticket.arrival)]

    def deny(self, ticket_id: TicketId, retry_after_s: float, now: float) -> list[Decision]:
        """Distributed mode: no global slot; the ticket waits again and its lane pauses."""
        entry = self._entries.get(ticket_id)
        if entry is None or entry.state is not State.RESERVING:
            return []
        model = self._models[entry.ticket.model]
        lane = model.lanes[entry.ticket.lane]
        model.release(entry, 0, served=False)
        self._enqueue(lane, entry, now)
        lane.blocked_until = now + max(retry_after_s, 0.0)
        out: list[Decision] = []
        self._dispatch(model, now, out)
        return out

    def drain(self) -> None:
        """Stop accepting new tickets; queued and running ones finish."""
        self.draining = True

    def next_wakeup(self) -> float | None:
        """The earliest time ``tick`` has work to do, or ``None``."""
        expiry = self._expiry
        while expiry and (
            expiry[0][2] != expiry[0][3].queue_gen or expiry[0][3].state is not State.QUEUED
        ):
            heapq.heappop(expiry)
        times = [model.wakeup for model in self._models.values() if model.wakeup is not None]
        if expiry:
            times.append(expiry[0][0])
        return min(times) if times else None

    # ------------------------------------------------------------------ views

    def models(self) -> list[str]:
        """Names of the configured models."""
        return list(self._models)

    def view(self, model: str, now: float = float("-inf")) -> ModelView:
        """A read-only snapshot of one model's queues, counts, limits and backends.

        Health is judged at ``now``; without it, circuits read as last stored.
        """
        return view_model(self._model(model), now)

    def lane_view(self, model: str, lane: str) -> LaneView:
        """A read-only snapshot of one lane."""
        for view in self.view(model).lanes:
            if view.name == lane:
                return view
        raise UnknownModelError(f"model {model!r} has no lane {lane!r}")

    def live_tickets(self) -> int:
        """Tickets not yet ended (queued, reserving, running or being preempted)."""
        return len(self._entries)

    def state_of(self, ticket_id: TicketId) -> State | None:
        """Where a live ticket is, or ``None`` once it has ended."""
        entry = self._entries.get(ticket_id)
        return None if entry is None else entry.state

    def counter(self, model: str, lane: str, tenant: str) -> float | None:
        """The tenant's fair-share counter in a lane with ``vtc`` fairness, else ``None``."""
        return self._model(model).lanes[lane].queue.counter(tenant)

    # ------------------------------------------------------------------ internals

    def _model(self, name: str) -> ModelRuntime:
        try:
            return self._models[name]
        except KeyError:
            raise UnknownModelError(f"unknown model {name!r}") from None

    def _refuse_early(self, model: ModelRuntime, ticket: Ticket, now: float) -> Reject | None:
        if self.draining:
            return self._reject(ticket, 503, ErrorCode.DRAINING, 5.0, "gateway is draining")
        if not model.any_healthy(now):
            reopen = [b.circuit.reopen_at() for b in model.backends]
            soonest = min((t for t in reopen if t is not None), default=now + 5.0)
            return self._reject(
                ticket, 503, ErrorCode.NO_HEALTHY_BACKEND, soonest - now, "no healthy backend"
            )
        wait = self._rate.try_acquire(ticket.tenant, ticket.prompt_tokens + ticket.max_tokens, now)
        if wait > 0.0:
            return self._reject(
                ticket, 429, ErrorCode.RATE_LIMIT_EXCEEDED, wait, "tenant rate limit exceeded"
            )
        return None

    def _new_entry(
        self, model: ModelRuntime, lane: LaneRuntime, ticket: Ticket, now: float
    ) -> Entry:
        predictor = model.predictor
        predicted = ticket.predicted_output_tokens
        if predicted is None:
            predicted = predictor.predict_output(ticket.lane, ticket.max_tokens)
        prefill_s = predictor.prefill_s(ticket.prompt_tokens)
        per_token_s = predictor.decode_s_per_token()
        deadline = ticket.deadline
        if deadline is None:
            deadline = ticket.arrival + lane.spec.slo_ms / 1000.0
        self._seq += 1
        service_s = prefill_s + predicted * per_token_s
        expire_at = now + lane.spec.queue_timeout_s
        # A shedding lane never runs a ticket that can no longer meet its deadline: later
        # arrivals that overtake it (tighter deadlines) would make it late and waste the slot.
        latest_start = deadline - service_s
        hopeless_first = lane.spec.shed_hopeless and latest_start < expire_at
        return Entry(
            ticket=ticket,
            seq=self._seq,
            deadline=deadline,
            predicted_output_tokens=predicted,
            prefill_s=prefill_s,
            decode_s_per_token=per_token_s,
            service_s=service_s,
            cost_tokens=ticket.prompt_tokens + predicted,
            expire_at=latest_start if hopeless_first else expire_at,
            expires_hopeless=hopeless_first,
            charged_tokens=ticket.prompt_tokens + ticket.max_tokens,
        )

    def _enqueue(self, lane: LaneRuntime, entry: Entry, now: float) -> None:
        entry.state = State.QUEUED
        entry.enqueued_at = now
        lane.queue.push(entry)
        heapq.heappush(self._expiry, (entry.expire_at, entry.seq, entry.queue_gen, entry))

    def _reject(
        self, ticket: Ticket, status: int, code: ErrorCode, wait_s: float, message: str
    ) -> Reject:
        return Reject(ticket, status, code, retry_wait_s(wait_s), message)

    def _end(self, entry: Entry, used_tokens: int, now: float) -> None:
        del self._entries[entry.ticket.id]
        unused = entry.charged_tokens - used_tokens
        if unused > 0:
            self._rate.refund(entry.ticket.tenant, unused, now)

    def _learn(self, model: ModelRuntime, entry: Entry, usage: Usage, now: float) -> None:
        """Feed a finished, not preempted, request to the predictor and the limit.

        The predictor learns only from answers the engine gave in full (``Feedback.SAMPLE``):
        a client's 4xx, a disconnect or an engine's 429 says nothing about output lengths.
        """
        ticket = entry.ticket
        if usage.limit_feedback is Feedback.SAMPLE:
            model.predictor.observe(
                lane=ticket.lane,
                max_tokens=ticket.max_tokens,
                prompt_tokens=usage.prompt_tokens,
                completion_tokens=usage.completion_tokens,
                ttft_s=usage.ttft_s,
                duration_s=now - entry.admitted_at,
            )
        if model.limit is not None:
            report_outcome(
                model.limit, usage, elapsed_s=now - entry.admitted_at, inflight=model.running + 1
            )

    # ------------------------------------------------------------------ dispatch

    def _dispatch(self, model: ModelRuntime, now: float, out: list[Decision]) -> None:
        """Grant free capacity to waiting tickets (``admission``), then preempt for urgent
        ones (``preemption``)."""
        if model.running < model.cap():
            admit_waiting(model, now, out, reserve=self._global_slots)
        preempt_for_blocked(model, now, out)
