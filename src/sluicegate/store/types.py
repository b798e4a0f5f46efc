"""What the gateway and the shared store exchange: plain data, no I/O.

The driver sends, per model and per flush, the model's limits as this replica
sees them and a list of operations (``Offer``, ``Drop``, ``Refund``); the store
answers with the tickets of this replica it granted and a snapshot of the
model's global counts (``SyncResult``).
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class LaneLimits:
    """One lane as the store's admission sees it (lanes are sent in configuration order).

    Attributes:
        name: the lane.
        cap: the lane's ``max_concurrency``; enforced globally unless ``borrow``.
        borrow: the lane may borrow, so only the model's cap bounds it globally.
        fair: the lane has ``vtc`` fairness: its waiting tickets are served by the
            tenants' global virtual token counters, then by order within a tenant.
        lend: the lane lends its idle own quota to borrowing lanes.
        shares: how a ``vtc`` lane gives a tenant under its share a slot back by
            preemption (``core/preemption.py``'s ``share_rule``: ``always``,
            ``priority``), or ``""``: it does not.
    """

    name: str
    cap: int
    borrow: bool = False
    fair: bool = False
    lend: bool = False
    shares: str = ""


@dataclass(frozen=True, slots=True)
class ModelLimits:
    """A model's global limits, as sent with every sync.

    Attributes:
        model: the model.
        cap: effective model-wide concurrency (the configured cap or this replica's
            adaptive limit).
        token_budget: the in-flight token budget, or ``None`` for none.
        lanes: the lanes, in configuration order (the order the store serves them).
    """

    model: str
    cap: int
    token_budget: int | None
    lanes: tuple[LaneLimits, ...]


@dataclass(frozen=True, slots=True)
class Offer:
    """A ticket of this replica waits for a global slot.

    Attributes:
        ticket: the ticket id (unique within this replica).
        lane: its lane.
        tenant: its tenant.
        weight: the tenant's fair-share weight.
        order: the lane ordering's key (smaller served first; compared
            lexicographically across replicas, so its times must be wall-clock
            based).
        cost_tokens: what it charges the model's in-flight token budget.
        vtc_charge: what admission adds to its tenant's virtual token counter
            before division by the weight (prompt + 2 × predicted output).
        priority: its priority (0 most important); a waiter preempts only less
            important tickets, and the store stops the least important first.
        urgent_at: when (wall-clock seconds) it becomes entitled to preempt: its
            latest start, or its lane's ``preempt_after_ms`` passed; ``None``: never.
        preempt_delay_s: once running, how long until it may be preempted (its lane's
            ``preemptible`` rule: 0 at once, the predicted time to a fraction of its
            output); ``None``: never.
        share_from: in a lane with tenant shares, when (wall-clock seconds) a slot may
            be given back to its tenant; ``None``: never.
    """

    ticket: str
    lane: str
    tenant: str
    weight: float
    order: tuple[float, ...]
    cost_tokens: int
    vtc_charge: float
    priority: int = 0
    urgent_at: float | None = None
    preempt_delay_s: float | None = None
    share_from: float | None = None


@dataclass(frozen=True, slots=True)
class Drop:
    """A ticket of this replica left: withdraw it from the waiting set, release its lease.

    Idempotent: dropping an unknown ticket does nothing.

    Attributes:
        ticket: the ticket id.
        vtc_correction: added to its tenant's counter (before division by the
            weight) if it held a lease: what it was really served minus ``vtc_charge``.
    """

    ticket: str
    vtc_correction: float = 0.0


@dataclass(frozen=True, slots=True)
class TenantRates:
    """A tenant's rate limits, with the same meaning as in ``core/ratelimit.py``.

    Attributes:
        tenant: the tenant.
        requests_per_s: request bucket rate, or ``None`` for no request limit.
        burst_requests: request bucket size.
        tokens_per_s: token bucket rate (``tokens_per_min / 60``), or ``None``.
        burst_tokens: token bucket size.
    """

    tenant: str
    requests_per_s: float | None
    burst_requests: float
    tokens_per_s: float | None
    burst_tokens: float


@dataclass(frozen=True, slots=True)
class Refund:
    """Give ``tokens`` back to the tenant's token bucket (capped at its burst)."""

    rates: TenantRates
    tokens: int


@dataclass(frozen=True, slots=True)
class Lease:
    """A running ticket of this replica, written back by ``resync`` after the store returns.

    Attributes:
        ticket: the ticket id.
        lane: its lane.
        tenant: its tenant.
        weight: the tenant's weight.
        cost_tokens: its share of the in-flight token budget.
        priority: its priority.
        preemptible_in_s: how long until it may be preempted (0: now); ``None``: never.
        borrowed: it runs on quota borrowed from a lending lane.
        counted: its lane gives tenants their shares back, so it counts in the lane's
            running tickets per tenant.
    """

    ticket: str
    lane: str
    tenant: str
    weight: float
    cost_tokens: int
    priority: int = 0
    preemptible_in_s: float | None = None
    borrowed: bool = False
    counted: bool = False


@dataclass(frozen=True, slots=True)
class GlobalCounts:
    """A model's counts across every live replica.

    Attributes:
        running: tickets holding a global slot.
        inflight_tokens: their summed ``cost_tokens``.
        waiting: tickets in the global waiting sets.
        replicas: live replicas.
        lanes_running: running tickets per lane.
        lanes_waiting: waiting tickets per lane.
    """

    running: int
    inflight_tokens: int
    waiting: int
    replicas: int
    lanes_running: dict[str, int] = field(default_factory=dict)
    lanes_waiting: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class SyncResult:
    """The store's answer to one sync of one model.

    Attributes:
        granted: tickets of this replica granted a global slot by this sync
            (grants to other replicas reach them through their grant lists).
        counts: the model's global counts after the sync.
        stops: running tickets of this replica the store chose as victims: stop them
            (stops of other replicas' tickets reach them through their grant lists).
    """

    granted: tuple[str, ...]
    counts: GlobalCounts
    stops: tuple[str, ...] = ()
