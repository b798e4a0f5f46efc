"""What the scheduler keeps between events, and the read-only accessors over it.

``SchedulerState`` holds each model's ``ModelRuntime`` (lanes, backends, counts), the
live tickets (their entries by id, their submission numbers, the expiry heap of the
queued ones, the queued ones distributed mode has yet to offer), the tenants' rate
limiter and the modes: draining, distributed (the shared store admits) and closed (the
store is down and the gateway fails closed). ``Scheduler`` (``core/scheduler.py``) is
this state plus the events that change it.
"""

from __future__ import annotations

from collections.abc import Mapping

from sluicegate.core.core_errors import UnknownModelError
from sluicegate.core.entry import Entry, State
from sluicegate.core.estimate import lane_work
from sluicegate.core.preemption import preemptible_after
from sluicegate.core.ratelimit import TenantRateLimiter
from sluicegate.core.runtime import LaneRuntime, ModelRuntime
from sluicegate.core.spec import SchedulerSpec
from sluicegate.core.ticket import TicketId
from sluicegate.core.views import (
    LaneView,
    ModelView,
    RunningLease,
    tenants_running,
    view_model,
)
from sluicegate.core.work_ahead import LaneWork


class SchedulerState:
    """The scheduler's state for every configured model, and the read-only views of it.

    ``rate_limiter`` charges the tenants' rate limits (default: one built from
    ``spec.tenants``).

    Attributes:
        spec: the configuration it was built from.
        draining: new tickets are refused (``Scheduler.drain``).
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
        self._shared = False
        self._closed = False
        self._offers: list[Entry] = []
        self._pressure_retry_s = 5.0
        self.draining = False

    @property
    def shared(self) -> bool:
        """Whether the shared store admits (distributed mode, store up)."""
        return self._shared

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

    def capacity(self, model: str) -> tuple[int, int | None]:
        """The model's effective cap and token budget: what distributed mode enforces globally."""
        runtime = self._model(model)
        return runtime.cap(), runtime.token_budget

    def ceilings(self, model: str) -> Mapping[str, int]:
        """The lanes of ``model`` cluster pressure holds, and the cap each keeps."""
        return self._model(model).ceilings

    def running_leases(self, model: str, now: float) -> list[RunningLease]:
        """The model's running tickets as a returning store must know them: token cost,
        how long until each may be preempted (``None``: never) and whether it borrowed."""
        runtime = self._model(model)
        leases = []
        for entry in runtime.running_entries.values():
            delay = preemptible_after(runtime.lanes[entry.ticket.lane].spec, entry)
            left = None if delay is None else max(0.0, entry.admitted_at + delay - now)
            leases.append(RunningLease(entry.ticket, entry.cost_tokens, left, entry.borrowed))
        return leases

    def tenants_running(self, model: str) -> dict[tuple[str, str], int]:
        """The model's running requests per (tenant, lane) (``views.tenants_running``)."""
        return tenants_running(self._model(model))

    def counter(self, model: str, lane: str, tenant: str) -> float | None:
        """The tenant's fair-share counter in a lane with ``vtc`` fairness, else ``None``."""
        return self._model(model).lanes[lane].queue.counter(tenant)

    def work_summary(self, model: str, now: float) -> dict[str, LaneWork]:
        """The work in ``model``'s shedding lanes at ``now`` (running and queued, with where
        the queued stands in each lane's order): what distributed mode publishes for the
        other replicas' start estimates (DESIGN §16)."""
        lanes = self._model(model).lane_order
        return {lane.spec.name: lane_work(lane, now) for lane in lanes if lane.spec.shed_hopeless}

    def _model(self, name: str) -> ModelRuntime:
        try:
            return self._models[name]
        except KeyError:
            raise UnknownModelError(f"unknown model {name!r}") from None

    def _running_entry(self, ticket_id: TicketId) -> Entry | None:
        """The live entry of a ticket that must be running (or being preempted), or
        ``None`` once it has ended; ``ValueError`` if it is queued."""
        entry = self._entries.get(ticket_id)
        if entry is not None and entry.state is State.QUEUED:
            raise ValueError(f"ticket {ticket_id!r} is {entry.state.value}, not running")
        return entry

    def _waiting(self) -> list[Entry]:
        """Every queued entry, in submission order."""
        queued = (entry for entry in self._entries.values() if entry.state is State.QUEUED)
        return sorted(queued, key=lambda entry: entry.seq)

    def _lane_of(self, entry: Entry) -> LaneRuntime:
        return self._models[entry.ticket.model].lanes[entry.ticket.lane]
