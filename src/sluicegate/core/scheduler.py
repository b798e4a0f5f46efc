"""The scheduler: a sans-I/O state machine that decides whether, when and where requests run.

A driver (the gateway in real time, the simulator in virtual time) feeds it
events, each with a timestamp, and executes the decisions it returns::

    submit(ticket, now)            -> [Admit | Queued | Reject, Preempt...]
    complete(id, usage, now)       -> [Admit..., Preempt...]
    bounce(id, now)                -> [Admit... | Expire, Preempt...]  backend refused it
    cancel(id, now)                -> [Admit...]
    tick(now)                      -> [Expire..., Admit..., Preempt...]
    observe_backend(stats, now)    -> [Admit...]
    next_wakeup()                  -> when to call ``tick`` next

and, in distributed mode (DESIGN §16), where a shared store admits::

    use_store(now)                 -> [Reserve...]  every queued ticket, offered
    grant(id, now)                 -> [Admit]       the store granted it a slot
    stop(id)                       -> [Preempt]     the store chose it as a victim
    lose_store(now, ...)           -> [Admit... | Expire...]  local limits, or closed

Nothing here reads a clock, sleeps or does I/O, so the same code runs in the
gateway and the simulator.

This module is the entry point. Decisions flow down and events flow up: each
event method asks the modules below for a verdict and gets a value back, then
changes the state it owns (the live tickets, their queues and expiry, kept in
``SchedulerState``, ``core/scheduler_state.py``), and runs one *dispatch* for the
model concerned: ``admission.admit_waiting`` grants free capacity to waiting
tickets, then ``preemption.preempt_for_blocked`` stops running tickets for urgent
ones (a model with nothing queued has nothing to dispatch). A new ticket's
verdict is ``intake.arrive``'s; a model's slot accounting, and what a ticket's
end does to its backend and teaches the model, are ``ModelRuntime``'s
(``occupy``, ``release``, ``finish``, ``bounced`` in ``runtime``).
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping, Sequence

from sluicegate.core.admission import admit_granted, admit_waiting
from sluicegate.core.core_errors import UnknownModelError
from sluicegate.core.decisions import Decision, ErrorCode, Expire, Queued
from sluicegate.core.entry import Entry, State
from sluicegate.core.estimate import set_remote
from sluicegate.core.intake import arrive, expire, offer, refuse_bounced
from sluicegate.core.kv_index import BlockIndex, KvEvent
from sluicegate.core.preemption import preempt_for_blocked, stop_for_store
from sluicegate.core.pressure import lane_ceilings
from sluicegate.core.ratelimit import TenantRateLimiter
from sluicegate.core.runtime import LaneRuntime, ModelRuntime
from sluicegate.core.scheduler_state import SchedulerState
from sluicegate.core.ticket import BackendStats, Ticket, TicketId, Usage
from sluicegate.core.work_ahead import RemoteWork


class Scheduler(SchedulerState):
    """Admission control, queueing, preemption and routing for every configured model.

    Invariants (checked by the property tests): a lane's own running count
    never exceeds its cap; a model never admits above its effective cap or
    token budget; every submitted ticket ends exactly once (completed,
    rejected, expired, cancelled or preempted); with no live tickets, every
    count is zero and every queue empty.

    In distributed mode (``use_store``) the caps and rate limits are the shared
    store's: a ticket that passes the local checks (health, queue size,
    shedding) queues here and is offered to the store (``Reserve``), and runs
    when the store grants it (``grant``). The store also chooses preemption victims
    across replicas (``stop``).
    """

    # ------------------------------------------------------------------ events

    def submit(self, ticket: Ticket, now: float) -> list[Decision]:
        """A new request: admit it, queue it or reject it."""
        model = self._model(ticket.model)
        lane = model.lanes.get(ticket.lane)
        if lane is None:
            raise UnknownModelError(f"model {ticket.model!r} has no lane {ticket.lane!r}")
        if ticket.id in self._entries:
            raise ValueError(f"ticket {ticket.id!r} is already live")
        rate = None if self._shared else self._rate  # in shared mode the driver charged the store
        entry, refusal, wait = arrive(
            model,
            lane,
            ticket,
            now,
            seq=self._seq + 1,
            shared=self._shared,
            draining=self.draining,
            closed=self._closed,
            rate=rate,
            pressure_retry_s=self._pressure_retry_s,
        )
        if entry is not None:
            self._seq = entry.seq
        if refusal is not None:
            return [refusal]
        assert entry is not None, "arrive makes an entry for every ticket it does not refuse"
        self._entries[ticket.id] = entry
        if self._shared:
            self._enqueue(lane, entry, now)
            offers: list[Decision] = [Queued(ticket, wait)]
            self._dispatch(model, now, offers)
            return offers
        queue = lane.queue
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
        entry = self._running_entry(ticket_id)
        if entry is None:
            return []
        model = self._models[entry.ticket.model]
        preempted = entry.state is State.PREEMPTING and not ran_to_end
        model.finish(entry, usage, now, learn=not preempted)
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

    def bounce(self, ticket_id: TicketId, now: float) -> list[Decision]:
        """A running ticket's backend refused its connection before anything was sent.

        The backend's circuit opens at once; the slot is given back teaching nothing
        (not served, no sample); the ticket queues again, with its place, deadline and
        expiry, for another backend, unless ``refuse_bounced`` ends it (an ``Expire``).
        Unknown or already-ended tickets are a no-op.
        """
        entry = self._running_entry(ticket_id)
        if entry is None:
            return []
        model = self._models[entry.ticket.model]
        model.bounced(entry, now)
        entry.bounces += 1
        out: list[Decision] = []
        refusal = refuse_bounced(model, entry, now)
        if refusal is None:
            entry.generated_tokens = 0
            self._enqueue(model.lanes[entry.ticket.lane], entry, now)
        else:
            self._end(entry, 0, now)
            out.append(refusal)
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
        """A running ticket has generated ``generated_tokens`` so far (streaming drivers).
        Its first token ends its prefill: its backend's prefill backlog drops its share."""
        entry = self._entries.get(ticket_id)
        if entry is not None:
            entry.generated_tokens = generated_tokens
            if generated_tokens > 0 and entry.prefill_tokens and entry.state is not State.QUEUED:
                backend = self._models[entry.ticket.model].backend(entry.backend)
                backend.prefill_backlog_tokens -= entry.prefill_tokens
                entry.prefill_tokens = 0

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
            out.append(expire(model, model.lanes[entry.ticket.lane], entry, now))
            self._end(entry, 0, now)
            touched.add(model.spec.name)
        for name, model in self._models.items():
            if name in touched or (model.wakeup is not None and model.wakeup <= now):
                self._dispatch(model, now, out)
        return out

    def observe_backend(self, stats: BackendStats, now: float) -> list[Decision]:
        """A health probe or metrics scrape of one backend."""
        model = self._model(stats.model)
        model.observe(stats, now)
        out: list[Decision] = []
        self._dispatch(model, now, out)
        return out

    def observe_kv_events(
        self, model: str, backend: str, events: Sequence[KvEvent], max_blocks: int
    ) -> None:
        """KV cache events of one backend's engine, in the order it sent them: its block
        index (at most ``max_blocks`` blocks, created on the first events) follows them.
        They decide nothing by themselves; the next routing decision reads the index."""
        state = self._model(model).backend(backend)
        if state.kv_index is None:
            state.kv_index = BlockIndex(max_blocks)
        state.kv_index.apply(events)

    def grant(self, ticket_id: TicketId, now: float) -> list[Decision]:
        """Distributed mode: the store granted a global slot to a ticket ``Reserve`` offered.

        The ticket leaves its queue and runs on the backend the router picks:
        ``[Admit]``. A ticket no longer queued here (it ended, or already runs)
        gets nothing: ``[]``, and the driver gives the slot back. With no
        backend free, the ticket stays queued and is offered again: ``[Reserve]``.
        """
        entry = self._entries.get(ticket_id)
        if entry is None or entry.state is not State.QUEUED:
            return []
        model = self._models[entry.ticket.model]
        lane = model.lanes[entry.ticket.lane]
        admit = admit_granted(model, lane, entry, now)
        return [offer(model, lane, entry)] if admit is None else [admit]

    def stop(self, ticket_id: TicketId) -> list[Decision]:
        """Distributed mode: the store chose this running ticket as a victim for a more
        urgent one, possibly waiting on another replica: ``[Preempt]`` (abort or requeue, by
        its lane's rules). A ticket not running here, or already stopping, gets ``[]``."""
        entry = self._entries.get(ticket_id)
        if entry is None or entry.state is not State.RUNNING:
            return []
        return [stop_for_store(self._models[entry.ticket.model], entry)]

    def use_store(self, now: float) -> list[Decision]:
        """Enter distributed mode (or return to it): the store's limits replace the local
        ones, and every queued ticket is offered to it (``Reserve``)."""
        self._shared = True
        self._closed = False
        for model in self._models.values():
            model.set_share(1.0)
        return [
            offer(self._models[entry.ticket.model], self._lane_of(entry), entry)
            for entry in self._waiting()
        ]

    def lose_store(
        self,
        now: float,
        *,
        fail_open: bool,
        share: float,
        rate_limiter: TenantRateLimiter | None = None,
    ) -> list[Decision]:
        """The shared store failed: fall back to local limits or close.

        ``fail_open``: enforce ``share`` of every cap and budget here (1/replicas),
        with ``rate_limiter`` (the tenants' limits at that share) for tickets from
        now on; queued tickets are admitted locally as room allows. Otherwise
        every queued ticket ends with ``Expire`` (``STORE_UNAVAILABLE``) and new
        ones are refused until ``use_store``. Running tickets go on either way.
        """
        self._shared = False
        self._offers.clear()
        for runtime in self._models.values():
            set_remote(runtime, {})
        out: list[Decision] = []
        if fail_open:
            if rate_limiter is not None:
                self._rate = rate_limiter
            for model in self._models.values():
                model.set_share(share)
                self._dispatch(model, now, out)
            return out
        self._closed = True
        for entry in self._waiting():
            self._lane_of(entry).queue.remove(entry)
            self._end(entry, 0, now)
            out.append(Expire(entry.ticket, 1.0, ErrorCode.STORE_UNAVAILABLE))
        return out

    def set_remote_work(self, model: str, remote: Mapping[str, RemoteWork]) -> None:
        """Distributed mode: the other live replicas' work in ``model``'s shedding lanes, by
        lane (a lane not named has none), which start estimates add to this replica's
        (DESIGN §16). Ignored unless the store admits; ``lose_store`` clears it."""
        if self._shared:
            set_remote(self._model(model), remote)

    def set_pressure(self, stage: int, now: float, *, retry_s: float = 5.0) -> list[Decision]:
        """Tighten the last ``stage`` tightenable lanes of every model to their pressure
        floors (``core/pressure.py``); lanes let loose admit their waiters at once.
        ``retry_s``: the wait a closed lane's refusals advise (until the next poll)."""
        self._pressure_retry_s = retry_s
        out: list[Decision] = []
        for model in self._models.values():
            model.set_ceilings(lane_ceilings(model.spec, stage))
            self._dispatch(model, now, out)
        return out

    def drain(self) -> None:
        """Stop accepting new tickets; queued and running ones finish."""
        self.draining = True

    def undrain(self) -> None:
        """Accept new tickets again after ``drain`` (a no-op when not draining)."""
        self.draining = False

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

    # ------------------------------------------------------------------ internals

    def _enqueue(self, lane: LaneRuntime, entry: Entry, now: float) -> None:
        entry.state = State.QUEUED
        entry.enqueued_at = now
        lane.queue.push(entry)
        heapq.heappush(self._expiry, (entry.expire_at, entry.seq, entry.queue_gen, entry))
        if self._shared:
            self._offers.append(entry)

    def _end(self, entry: Entry, used_tokens: int, now: float) -> None:
        del self._entries[entry.ticket.id]
        unused = entry.charged_tokens - used_tokens
        if unused > 0:
            self._rate.refund(entry.ticket.tenant, unused, now)

    # ------------------------------------------------------------------ dispatch

    def _dispatch(self, model: ModelRuntime, now: float, out: list[Decision]) -> None:
        """Grant free capacity to waiting tickets (``admission``), then preempt for urgent
        ones (``preemption``). In distributed mode the store admits: offer what queued."""
        if self._shared:
            model.wakeup = None
            for entry in self._offers:
                if entry.state is State.QUEUED:
                    owner = self._models[entry.ticket.model]
                    out.append(offer(owner, self._lane_of(entry), entry))
            self._offers.clear()
            return
        for lane in model.lane_order:
            if len(lane.queue):
                break
        else:
            model.wakeup = None  # nothing waits: nothing to admit, nothing to preempt for
            return
        if model.running < model.cap():
            admit_waiting(model, now, out)
        preempt_for_blocked(model, now, out)
