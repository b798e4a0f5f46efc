"""Live state of models and lanes: counts, budgets and the per-model collaborators."""

from __future__ import annotations

from collections.abc import Mapping

from sluicegate.core.backend import BackendState
from sluicegate.core.circuit import CircuitBreaker
from sluicegate.core.entry import Entry
from sluicegate.core.limits import Limit, make_limit
from sluicegate.core.policies import make_queue
from sluicegate.core.predictor import Predictor
from sluicegate.core.routing import Router, make_router
from sluicegate.core.spec import LaneSpec, ModelSpec
from sluicegate.core.ticket import MAX_PRIORITY, TicketId


class LaneRuntime:
    """One lane's queue and running counts.

    Attributes:
        own: running tickets on the lane's own quota (never above ``cap``).
        borrowed: running tickets on capacity borrowed from other lanes.
        pending_preempts: preemptions issued on behalf of this lane, not yet freed.
        blocked_until: distributed mode: a denied global slot pauses the lane until then.
    """

    __slots__ = ("blocked_until", "borrowed", "cap", "own", "pending_preempts", "queue", "spec")

    def __init__(self, spec: LaneSpec, weights: Mapping[str, float]) -> None:
        self.spec = spec
        self.cap = spec.max_concurrency
        self.queue = make_queue(spec, weights)
        self.own = 0
        self.borrowed = 0
        self.pending_preempts = 0
        self.blocked_until = 0.0

    @property
    def running(self) -> int:
        """All running tickets of the lane, own and borrowed."""
        return self.own + self.borrowed


class ModelRuntime:
    """One model's lanes, backends, budgets, router, adaptive limit and predictor."""

    __slots__ = (
        "backend_by_name",
        "backend_slots",
        "backends",
        "borrowed_running",
        "inflight_tokens",
        "lane_order",
        "lanes",
        "limit",
        "predictor",
        "router",
        "running",
        "running_by_priority",
        "running_entries",
        "spec",
        "wakeup",
    )

    def __init__(self, spec: ModelSpec, weights: Mapping[str, float]) -> None:
        self.spec = spec
        self.lane_order = [LaneRuntime(lane, weights) for lane in spec.lanes]
        self.lanes = {lane.spec.name: lane for lane in self.lane_order}
        self.backends = [
            BackendState(
                backend,
                CircuitBreaker(failures=spec.circuit_failures, cooldown_s=spec.circuit_cooldown_s),
            )
            for backend in spec.backends
        ]
        self.backend_by_name = {backend.spec.name: backend for backend in self.backends}
        caps = [backend.max_concurrency for backend in spec.backends]
        # Slots the backends offer in all, when every one is capped (llama.cpp: 1 each).
        self.backend_slots: int | None = (
            sum(c for c in caps if c is not None) if caps and None not in caps else None
        )
        self.router: Router = make_router(spec.router, self.backends)
        self.limit: Limit | None = (
            make_limit(spec.adaptive, spec.max_concurrency) if spec.adaptive is not None else None
        )
        self.predictor = Predictor(spec)
        self.running = 0
        self.borrowed_running = 0
        self.inflight_tokens = 0
        self.running_entries: dict[TicketId, Entry] = {}
        self.running_by_priority = [0] * (MAX_PRIORITY + 1)
        self.wakeup: float | None = None

    def cap(self) -> int:
        """The effective model-wide concurrency: the configured cap or the adaptive limit."""
        if self.limit is None:
            return self.spec.max_concurrency
        return min(self.spec.max_concurrency, self.limit.value)

    def runs_less_important_than(self, priority: int) -> bool:
        """Whether any running ticket has a numerically higher (less important) priority."""
        return any(self.running_by_priority[priority + 1 :])

    def lendable(self) -> int:
        """Idle own-quota of lending lanes not already lent out."""
        idle = -self.borrowed_running
        for lane in self.lane_order:
            if lane.spec.lend and lane.own < lane.cap:
                idle += lane.cap - lane.own
        return idle

    def tokens_fit(self, entry: Entry) -> bool:
        """Whether ``entry`` fits the in-flight token budget (always, when nothing runs)."""
        budget = self.spec.max_inflight_tokens
        return (
            budget is None
            or self.running == 0
            or (self.inflight_tokens + entry.cost_tokens <= budget)
        )

    def any_healthy(self, now: float) -> bool:
        """Whether at least one backend may take traffic."""
        return any(backend.healthy(now) for backend in self.backends)

    def backend(self, name: str) -> BackendState:
        """The backend called ``name``; ``KeyError`` if there is none."""
        return self.backend_by_name[name]
