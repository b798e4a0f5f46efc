"""The asyncio driver of ``core.Scheduler``: real time, futures for waiters, one timer.

Every scheduler event is fed the driver's clock (``time.monotonic()``, the clock
asyncio's loop uses, unless another is injected: ``gateway/clock.py``), and
every decision it returns is executed here: an ``Admit`` resolves the waiting
request's future, a ``Preempt`` signals the running request's handle, and the
single timer is re-armed at ``next_wakeup()``.

In distributed mode (DESIGN §16) a ``StoreLink`` stands between the scheduler
and the shared store: ``Reserve`` offers go to it, ended tickets are withdrawn
or released through it, rate limits are charged in the store before a ticket
is submitted, and the store's grants come back as ``granted``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, assert_never

from sluicegate.core.decisions import (
    Admit,
    Decision,
    ErrorCode,
    Expire,
    Preempt,
    Queued,
    Reject,
    Reserve,
)
from sluicegate.core.entry import State
from sluicegate.core.kv_index import KvEvent
from sluicegate.core.ratelimit import TenantRateLimiter
from sluicegate.core.retry import retry_wait_s
from sluicegate.core.scheduler import Scheduler
from sluicegate.core.ticket import BackendStats, Ticket, TicketId, Usage

if TYPE_CHECKING:
    from sluicegate.gateway.distributed.store_link import StoreLink

Verdict = Admit | Reject | Expire


class RunningHandle:
    """What the driver knows of a running request: how to tell it it was preempted."""

    __slots__ = ("on_preempt", "preempt")

    def __init__(self) -> None:
        self.preempt: Preempt | None = None
        self.on_preempt: Callable[[Preempt], None] | None = None


class SchedulerDriver:
    """Drives one ``Scheduler`` from the event loop.

    ``submit`` returns a future resolved with the ticket's verdict (``Admit``,
    ``Reject`` or ``Expire``). After an ``Admit`` the caller must eventually
    call exactly one of ``complete`` or ``cancel``; before it, ``cancel``.
    """

    def __init__(
        self,
        scheduler: Scheduler,
        *,
        clock: Callable[[], float] = time.monotonic,
        on_expire: Callable[[Expire], None] | None = None,
        link: StoreLink | None = None,
    ) -> None:
        self.scheduler = scheduler
        self.link = link
        self._takes: set[asyncio.Task[None]] = set()
        self._clock = clock
        self._waiters: dict[TicketId, asyncio.Future[Verdict]] = {}
        self._running: dict[TicketId, RunningHandle] = {}
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at: float | None = None
        self._on_expire = on_expire

    def now(self) -> float:
        """The driver's clock."""
        return self._clock()

    def submit(self, ticket: Ticket) -> asyncio.Future[Verdict]:
        """Hand a new ticket to the scheduler; the future resolves with its verdict."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Verdict] = loop.create_future()
        self._waiters[ticket.id] = future
        link = self.link
        if link is not None and link.needs_take(ticket):
            task = loop.create_task(self._take_then_submit(link, ticket))
            self._takes.add(task)
            task.add_done_callback(self._takes.discard)
        else:
            self._execute(self.scheduler.submit(ticket, self._clock()))
        return future

    async def _take_then_submit(self, link: StoreLink, ticket: Ticket) -> None:
        """Charge the tenant's rate limits in the store, then submit (or refuse with 429)."""
        wait = await link.take(ticket)
        future = self._waiters.get(ticket.id)
        if future is None or future.done():  # the client left meanwhile
            self._waiters.pop(ticket.id, None)
            link.released(ticket.id, (0, 0), ended=True)
            return
        if wait is not None and wait > 0.0:
            del self._waiters[ticket.id]
            message = "tenant rate limit exceeded"
            code = ErrorCode.RATE_LIMIT_EXCEEDED
            future.set_result(Reject(ticket, 429, code, retry_wait_s(wait), message))
            return
        self._execute(self.scheduler.submit(ticket, self._clock()))

    def handle(self, ticket_id: TicketId) -> RunningHandle:
        """The handle of an admitted ticket (created on admission)."""
        return self._running[ticket_id]

    def complete(self, ticket_id: TicketId, usage: Usage, *, ran_to_end: bool = False) -> None:
        """An admitted ticket's upstream request ended (successfully or not); ``ran_to_end``:
        the engine gave the whole answer, even if a ``Preempt`` raced with it."""
        self._running.pop(ticket_id, None)
        decisions = self.scheduler.complete(ticket_id, usage, self._clock(), ran_to_end=ran_to_end)
        self._released(ticket_id, (usage.prompt_tokens, usage.completion_tokens))
        self._execute(decisions)

    def bounce(self, ticket_id: TicketId) -> None:
        """An admitted ticket's backend refused its connection before anything was sent:
        the scheduler marks it down and queues the ticket again or expires it; its waiter
        (``requeue_wait``, registered first) gets the verdict."""
        self._running.pop(ticket_id, None)
        decisions = self.scheduler.bounce(ticket_id, self._clock())
        self._released(ticket_id, (0, 0))
        self._execute(decisions)

    def progress(self, ticket_id: TicketId, generated_tokens: int) -> None:
        """A running stream has produced ``generated_tokens`` so far."""
        self.scheduler.progress(ticket_id, generated_tokens)

    def requeue_wait(self, ticket_id: TicketId) -> asyncio.Future[Verdict]:
        """After a requeue preemption was completed: wait for the ticket's next verdict."""
        future: asyncio.Future[Verdict] = asyncio.get_running_loop().create_future()
        if self.scheduler.state_of(ticket_id) is None:
            future.cancel()
            return future
        self._waiters[ticket_id] = future
        return future

    def cancel(self, ticket_id: TicketId) -> None:
        """The client went away; drop the ticket wherever it is."""
        future = self._waiters.pop(ticket_id, None)
        if future is not None and not future.done():
            future.cancel()
        self._running.pop(ticket_id, None)
        decisions = self.scheduler.cancel(ticket_id, self._clock())
        self._released(ticket_id, None)
        self._execute(decisions)

    def observe(self, stats: BackendStats) -> None:
        """Feed a health probe or metrics scrape to the scheduler."""
        self._execute(self.scheduler.observe_backend(stats, self._clock()))

    def observe_kv_events(
        self, model: str, backend: str, events: Sequence[KvEvent], max_blocks: int
    ) -> None:
        """Feed a backend's KV cache events to the scheduler (``gateway/ops/kv_subscriber.py``);
        they decide nothing by themselves."""
        self.scheduler.observe_kv_events(model, backend, events, max_blocks)

    def set_pressure(self, stage: int, *, retry_s: float) -> None:
        """Cluster pressure moved to ``stage`` (``gateway/ops/pressure_loop.py``)."""
        self._execute(self.scheduler.set_pressure(stage, self._clock(), retry_s=retry_s))

    def _execute(self, decisions: Iterable[Decision]) -> None:
        pending = list(decisions)
        while pending:
            decision = pending.pop(0)
            tid = decision.ticket.id
            match decision:  # exhaustive: a kind without a case fails mypy (assert_never)
                case Admit():
                    future = self._waiters.pop(tid, None)
                    if future is None or future.done():
                        # Its client left between the decision and now: give the slot back.
                        pending.extend(self.scheduler.cancel(tid, self._clock()))
                        self._released(tid, (0, 0))
                        continue
                    self._running[tid] = RunningHandle()
                    future.set_result(decision)
                case Reject() | Expire():
                    future = self._waiters.pop(tid, None)
                    if future is not None and not future.done():
                        future.set_result(decision)
                    if isinstance(decision, Expire) and self._on_expire is not None:
                        self._on_expire(decision)
                    self._released(tid, (0, 0))
                case Preempt():
                    running = self._running.get(tid)
                    if running is None:
                        pending.extend(self.scheduler.complete(tid, Usage(0, 0), self._clock()))
                        self._released(tid, (0, 0))
                        continue
                    running.preempt = decision
                    if running.on_preempt is not None:
                        running.on_preempt(decision)
                case Reserve():
                    assert self.link is not None, "Reserve comes only in distributed mode"
                    self.link.offer(decision)
                case Queued():
                    continue
                case _:
                    assert_never(decision)
        self._arm_timer()

    def _released(self, ticket_id: TicketId, served: tuple[int, int] | None) -> None:
        """Distributed mode: tell the store link a ticket left its queue or its slot, having
        been served ``served`` (prompt, completion) tokens (``None``: not known)."""
        if self.link is not None:
            ended = self.scheduler.state_of(ticket_id) is None
            self.link.released(ticket_id, served, ended=ended)

    # ------------------------------------------------------------------ store link calls

    def granted(self, model: str, ticket_id: TicketId) -> None:
        """The store granted a global slot: admit the ticket, or give the slot back. A grant
        for a ticket already running here repeats one it had (a re-offer after a listener
        failure): it is the same slot, so nothing is given back."""
        decisions = self.scheduler.grant(ticket_id, self._clock())
        if not decisions or not isinstance(decisions[0], Admit):
            if self.scheduler.state_of(ticket_id) in (State.RUNNING, State.PREEMPTING):
                return
            assert self.link is not None
            self.link.give_back(model, ticket_id)
        self._execute(decisions)

    def stop(self, ticket_id: TicketId) -> None:
        """The store chose a running ticket as a victim for a more urgent one: preempt it."""
        self._execute(self.scheduler.stop(ticket_id))

    def store_lost(self, *, fail_open: bool, share: float, limiter: TenantRateLimiter) -> None:
        """The store failed: admit locally at ``share`` of the limits, or close."""
        now = self._clock()
        decisions = self.scheduler.lose_store(
            now, fail_open=fail_open, share=share, rate_limiter=limiter
        )
        self._execute(decisions)

    def store_restored(self) -> None:
        """The store is back: every queued ticket is offered."""
        self._execute(self.scheduler.use_store(self._clock()))

    def clock_jumped(self) -> None:
        """The clock moved ahead at once (a test's ``OffsetClock``): re-arm the timer at
        ``next_wakeup()`` as seen from the new time."""
        self._timer_at = None
        self._arm_timer()

    def _arm_timer(self) -> None:
        wakeup = self.scheduler.next_wakeup()
        if wakeup == self._timer_at:
            return
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._timer_at = wakeup
        if wakeup is not None:
            loop = asyncio.get_running_loop()
            # The loop's clock need not be the scheduler's: hand it a delay, not a time.
            delay = max(0.0, wakeup - self._clock())
            self._timer = loop.call_at(loop.time() + delay, self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        self._timer_at = None
        self._execute(self.scheduler.tick(self._clock()))

    def close(self) -> None:
        """Stop the timer (at shutdown)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
