"""Distributed mode's I/O (DESIGN §16): the driver's link to the shared store.

The scheduler stays sans-I/O. In global mode it queues each ticket and offers
it (``Reserve``); the store grants global slots to the best waiting tickets of
every replica. This link turns the driver's calls into store operations,
batched per event-loop turn into one pipelined round trip (``RedisStore.sync``),
and hands grants back to the driver: this replica's from the sync's answer,
those freed by other replicas through the listener (a blocking pop of this
replica's grant lists). It charges tenants' rate limits in the store before a
ticket is submitted. Its connection's life — fallback when the store fails
(``fail_open``: local limits at 1/replicas; ``fail_closed``: 503
``store_unavailable``), probe, rejoin, heartbeat, grant listener — is
``gateway/distributed/link_lifecycle.py``.

Each time it enters global mode the link opens a new *session*: a fresh
connection under the replica id ``<replica>.<n>``. Commands the old session
sent before a timeout may still run when a paused store resumes; they touch
only the old id's keys, which stop counting within one lease TTL (nobody
keeps that id alive) and are then reaped. So a failure can over-count
capacity for at most one TTL, never leak it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from sluicegate.core.decisions import Reserve
from sluicegate.core.fair_queue import VTC_INPUT_WEIGHT, VTC_OUTPUT_WEIGHT
from sluicegate.core.preemption import share_rule
from sluicegate.core.scheduler import Scheduler
from sluicegate.core.spec import TenantSpec
from sluicegate.core.ticket import Ticket, TicketId
from sluicegate.gateway.distributed.distributed_metrics import StoreMetrics
from sluicegate.gateway.distributed.link_lifecycle import LinkLifecycle
from sluicegate.gateway.distributed.link_modes import (
    MAX_OPS_PER_SYNC,
    STOP_PREFIX,
    LinkMode,
    StoreClient,
    store_lease,
    tenant_rates,
)
from sluicegate.gateway.distributed.link_view import LinkView
from sluicegate.gateway.distributed.urgency_timers import UrgencyTimers
from sluicegate.store.redis_store import RedisStore
from sluicegate.store.store_config import DistributedSpec
from sluicegate.store.store_errors import StoreUnavailableError
from sluicegate.store.types import (
    Drop,
    GlobalCounts,
    LaneLimits,
    Lease,
    ModelLimits,
    Offer,
    Refund,
)

_log = logging.getLogger("sluicegate.store")


def _no_refunds(ops: list[Offer | Drop | Refund]) -> list[Offer | Drop | Refund]:
    return [op for op in ops if not isinstance(op, Refund)]


__all__ = ["LinkMode", "StoreClient", "StoreLink"]


@dataclass(slots=True)
class _Held:
    """What the link remembers of a live ticket it told the store about."""

    model: str
    tenant: str
    vtc_charge: float = 0.0
    charged_tokens: int = 0
    known: bool = False  # the store holds it: waiting, or running on a lease


class StoreLink(LinkLifecycle):
    """One replica's link to the shared store; see the module docstring."""

    def __init__(
        self,
        open_store: Callable[[str], RedisStore],
        replica: str,
        settings: DistributedSpec,
        scheduler: Scheduler,
        tenants: Mapping[str, TenantSpec],
    ) -> None:
        self.replica = replica
        self.session = 1
        self._open_store = open_store
        self.store = open_store(f"{replica}.1")
        self.settings = settings
        self.mode = self._fallback_mode()
        self.replicas = 1
        self.counts: dict[str, GlobalCounts] = {}
        self.metrics: StoreMetrics | None = None
        self._scheduler = scheduler
        self._tenants = tenants
        self._rates = {
            name: tenant_rates(spec)
            for name, spec in tenants.items()
            if spec.requests_per_s is not None or spec.tokens_per_min is not None
        }
        self._lanes = {
            model.name: tuple(
                LaneLimits(
                    lane.name,
                    lane.max_concurrency,
                    lane.borrow,
                    lane.queue_policy[1] == "vtc",
                    lane.lend,
                    share_rule(lane),
                )
                for lane in model.lanes
            )
            for model in scheduler.spec.models
        }
        self.view = LinkView(self.mode.value, open_store, self._lanes, tenants)
        self._client: StoreClient | None = None
        self._held: dict[TicketId, _Held] = {}
        self._outbox: dict[str, list[Offer | Drop | Refund]] = {}
        self._resyncing = False
        self._tasks: set[asyncio.Task[None]] = set()
        self._flushing: asyncio.Task[None] | None = None
        self._urgency = UrgencyTimers(self._nudge)

    # ------------------------------------------------------------------ lifecycle

    async def start(self, client: StoreClient) -> None:
        """Connect and enter global mode; if the store is unreachable, start in the fallback
        and probe. No replica count is known yet: ``fail_open`` keeps 1/``expected_replicas``
        of every limit, or without it refuses with 503 ``store_unavailable`` (as
        ``fail_closed``) until the store first answers."""
        self._client = client
        try:
            await self.store.connect()
        except StoreUnavailableError as exc:
            self._fail(exc, "connect")
            return
        await self._restore()

    async def close(self) -> None:
        """Stop the background tasks and close the connections."""
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError, StoreUnavailableError):
                await task
        await self.store.close()
        await self.view.close()

    @property
    def is_global(self) -> bool:
        """Whether the shared store admits now."""
        return self.mode is LinkMode.GLOBAL and not self._resyncing

    def status(self) -> dict[str, object]:
        """The link's state for ``/admin/state``: mode (``global``, ``rejoining`` while it
        writes its leases back and waits for the other replicas, ``fail_open``,
        ``fail_closed``), replica and session, replica count, the global counts, and what
        ``LinkView.status`` adds (since when, fallbacks, last sync, tenants' running counts)."""
        return {
            "kind": "redis",
            "mode": "rejoining" if self._resyncing else self.mode.value,
            "replica": self.replica,
            "session": self.store.replica,
            "replicas": self.replicas,
            "on_store_failure": self.settings.on_store_failure,
            "global": {
                model: {
                    "running": counts.running,
                    "waiting": counts.waiting,
                    "inflight_tokens": counts.inflight_tokens,
                }
                for model, counts in self.counts.items()
            },
            **self.view.status(),
        }

    async def read_global_tenants(self) -> None:
        """In global mode, refresh the store's running tickets per tenant for ``status`` and
        the metrics (``LinkView.read_tenants``: for ``/admin/state`` and ``/metrics``)."""
        if self.is_global:
            await self.view.read_tenants(self.store.replica)

    # ------------------------------------------------------------------ driver calls

    def needs_take(self, ticket: Ticket) -> bool:
        """Whether ``ticket``'s tenant has rate limits the store must charge first."""
        return self.mode is LinkMode.GLOBAL and ticket.tenant in self._rates

    async def take(self, ticket: Ticket) -> float | None:
        """Charge the tenant's buckets in the store: 0.0 taken, > 0 the wait, ``None`` if the
        store failed meanwhile (the driver then submits in the fallback)."""
        rates = self._rates[ticket.tenant]
        tokens = ticket.prompt_tokens + ticket.max_tokens
        started = time.perf_counter()
        give_up = time.monotonic() + self._retry_budget_s()
        while True:
            try:
                wait = await self.store.take(rates, tokens, request=ticket.id)
                break
            except StoreUnavailableError as exc:
                if not await self._retrying(exc, "take", give_up):
                    return None
        self._observe("take", started)
        if wait == 0.0:
            self._hold(ticket).charged_tokens = tokens
        return wait

    def offer(self, reserve: Reserve) -> None:
        """Send the store an offer for a queued ticket."""
        ticket = reserve.ticket
        held = self._hold(ticket)
        held.vtc_charge = reserve.vtc_charge
        held.known = True
        op = Offer(
            ticket.id,
            ticket.lane,
            ticket.tenant,
            self._weight(ticket),
            reserve.order,
            reserve.cost_tokens,
            reserve.vtc_charge,
            ticket.priority,
            reserve.urgent_at,
            reserve.preempt_delay_s,
            reserve.share_from,
        )
        self._send(ticket.model, op)
        client = self._client
        if reserve.urgent_at is not None and client is not None and self.mode is LinkMode.GLOBAL:
            self._urgency.arm(ticket.model, ticket.id, reserve.urgent_at - client.now())

    def released(self, ticket_id: TicketId, served: tuple[int, int] | None, *, ended: bool) -> None:
        """A ticket left its slot or its queue: withdraw it or release its lease, and once it
        ended, refund the tokens it was charged and did not use.

        ``served`` is (prompt, completion) tokens it was served, which correct its
        tenant's counter; ``None`` when unknown (a client that left mid-answer):
        the admission charge stands and nothing is refunded.
        """
        self._urgency.disarm(ticket_id)
        held = self._held.get(ticket_id)
        if held is None:
            return
        if held.known:
            held.known = False
            correction = 0.0
            if served is not None:
                prompt, completion = served
                charge = VTC_INPUT_WEIGHT * prompt + VTC_OUTPUT_WEIGHT * completion
                correction = charge - held.vtc_charge
            self._send(held.model, Drop(ticket_id, correction))
        if not ended:
            return
        del self._held[ticket_id]
        if served is None or held.charged_tokens == 0:
            return
        unused = held.charged_tokens - served[0] - served[1]
        if unused > 0:
            self._send(held.model, Refund(self._rates[held.tenant], unused))

    def give_back(self, model: str, ticket_id: TicketId) -> None:
        """A grant came for a ticket that cannot use it: release the slot."""
        self._send(model, Drop(ticket_id))

    # ------------------------------------------------------------------ internals

    def _hold(self, ticket: Ticket) -> _Held:
        held = self._held.get(ticket.id)
        if held is None:
            held = self._held[ticket.id] = _Held(ticket.model, ticket.tenant)
        return held

    def _send(self, model: str, op: Offer | Drop | Refund) -> None:
        if self.mode is not LinkMode.GLOBAL:
            return
        self._outbox.setdefault(model, []).append(op)
        self._release_offers()

    def _limits(self, model: str) -> ModelLimits:
        cap, budget = self._scheduler.capacity(model)
        lanes = self._lanes[model]
        held = self._scheduler.ceilings(model)
        if held:
            # A lane cluster pressure holds is capped globally and borrows nothing.
            lanes = tuple(
                LaneLimits(lane.name, held[lane.name], False, lane.fair, lane.lend, lane.shares)
                if lane.name in held
                else lane
                for lane in lanes
            )
        return ModelLimits(model, cap, budget, lanes)

    async def _flush(self) -> None:
        """Send what the outbox holds, one pipelined round trip at a time, until it is empty."""
        try:
            while self._outbox and self.mode is LinkMode.GLOBAL and not self._resyncing:
                # A model with an empty list of ops still fills (the heartbeat's tick).
                batches = [(self._limits(model), ops) for model, ops in self._next_batch()]
                started = time.perf_counter()
                seq = self.store.next_seq()
                give_up = time.monotonic() + self._retry_budget_s()
                while True:
                    try:
                        results = await self.store.sync(batches, seq=seq)
                        break
                    except StoreUnavailableError as exc:
                        if not await self._retrying(exc, "sync", give_up):
                            return
                        # Refunds are not fenced: if the first attempt ran they were made.
                        batches = [(limits, _no_refunds(ops)) for limits, ops in batches]
                self._observe("sync", started)
                client = self._client
                assert client is not None
                for (limits, _), result in zip(batches, results, strict=True):
                    self.counts[limits.model] = result.counts
                    for ticket_id in result.granted:
                        self._urgency.disarm(TicketId(ticket_id))
                        client.granted(limits.model, TicketId(ticket_id))
                    for ticket_id in result.stops:
                        client.stop(TicketId(ticket_id))
        finally:
            self._flushing = None

    def _next_batch(self) -> list[tuple[str, list[Offer | Drop | Refund]]]:
        """Take the next round trip's ops out of the outbox: all of them, up to
        ``MAX_OPS_PER_SYNC`` (thousands of offers after a rejoin go in several syncs, each
        well inside the timeout), in the order they were sent."""
        batch: list[tuple[str, list[Offer | Drop | Refund]]] = []
        room = MAX_OPS_PER_SYNC
        for model in list(self._outbox):
            ops = self._outbox[model]
            if room <= 0 and ops:
                break
            batch.append((model, ops[:room]))
            if len(ops) > room:
                self._outbox[model] = ops[room:]
            else:
                del self._outbox[model]
            room -= len(ops)
        return batch

    def _leases(self, model: str) -> list[Lease]:
        client = self._client
        assert client is not None
        running = self._scheduler.running_leases(model, client.now())
        for lease in running:
            self._hold(lease.ticket).known = True
        counted = {lane.name for lane in self._lanes[model] if lane.fair and lane.shares}
        return [
            store_lease(lease, self._weight(lease.ticket), counted=lease.ticket.lane in counted)
            for lease in running
        ]

    def _deliver(self, model: str, item: str) -> None:
        """What another replica's sync pushed to this one's grant list: a grant, or
        ``!<ticket>``, a stop of a victim the store chose."""
        client = self._client
        assert client is not None
        if item.startswith(STOP_PREFIX):
            client.stop(TicketId(item.removeprefix(STOP_PREFIX)))
            return
        self._urgency.disarm(TicketId(item))
        client.granted(model, TicketId(item))

    def _nudge(self, model: str) -> None:
        """A waiter of ``model`` turned urgent: sync it (the store preempts at the fill)."""
        if self.mode is LinkMode.GLOBAL:
            self._outbox.setdefault(model, [])
            self._release_offers()

    def _forget(self) -> None:
        self._urgency.clear()
        self._outbox.clear()
        for held in self._held.values():
            held.known = False

    def _tick(self) -> None:
        for model in self._lanes:
            self._outbox.setdefault(model, [])
        self._release_offers()

    def _release_offers(self) -> None:
        if self._outbox and self._flushing is None and not self._resyncing:
            self._flushing = self._spawn(self._flush())

    def _weight(self, ticket: Ticket) -> float:
        spec = self._tenants.get(ticket.tenant)
        return 1.0 if spec is None else spec.weight
