"""Warm buffer: idle replicas that keep a burst's p99 queue wait under the SLO.

A burst multiplies the arrival rate by K from t = 0 until new replicas are ready
at ``T = detect_s + scale_up_s`` (the autoscaler noticing, then pod scheduling
and model load). Until then the replicas already up, ``n = base + warm``, are
all there is: ``c = n · slots`` servers facing ``K·λ``. The planner picks the
smallest warm count whose p99 wait at the end of that window (the worst
moment: the queue only grows while the burst outruns capacity) meets the SLO.

That p99 is the smaller of two estimates, each an upper bound in its regime:

* **stationary**: Allen–Cunneen G/G/c at ``K·λ`` (:mod:`sluicegate.planner.queueing`),
  when ``K·λ < cμ``. The queue starts from the lighter base load, so it only
  approaches this from below.
* **transient**: the queue over the window as Brownian motion reflected at 0,
  from empty, with drift ``θ = K·λ − cμ`` and variance rate
  ``σ² = K·λ·(c_a² + c_s²)`` (the heavy-traffic diffusion). Its level at T has
  the law of ``sup_{u≤T}(θu + σB_u)``, whose tail is closed-form
  (:mod:`sluicegate.planner.backlog`); the wait of an arrival at T is that
  backlog over the drain rate, ``Q_T/(cμ)``. When the burst outruns capacity
  (θ > 0) this is the fluid backlog ``(K·λ − cμ)·T`` plus a spread of order
  ``σ√T``; when it does not, it tends to the exponential tail of Kingman's
  heavy-traffic limit as T grows.

Switching from the stationary formula to the fluid backlog at ``K·λ = cμ`` would
make one more replica look worse (the stationary p99 is unbounded just below
saturation, the fluid backlog tiny just above), so both estimates are computed
at every c; each falls as c grows, and so does their minimum.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, replace

from sluicegate.planner.backlog import backlog_quantile, bisect_boundary
from sluicegate.planner.queueing import (
    PlanInfeasibleError,
    PlanInput,
    PlanResult,
    _allen_cunneen_factor,
    _erlang_b_step,
    _erlang_c_from_b,
    _wait_stats,
    plan_capacity,
)

__all__ = [
    "BURST_ASSUMPTIONS",
    "DEFAULT_BURST_FACTOR",
    "DEFAULT_DETECT_S",
    "DEFAULT_SCALE_UP_S",
    "RULE_OF_THUMB_ACTIVE",
    "RULE_OF_THUMB_IDLE",
    "Burst",
    "BurstWait",
    "WarmPlan",
    "burst_wait",
    "max_burst_factor",
    "plan_warm_buffer",
    "rule_of_thumb_warm",
]

DEFAULT_BURST_FACTOR = 2.0
DEFAULT_SCALE_UP_S = 90.0
DEFAULT_DETECT_S = 60.0
"""Burst start to the HPA asking for replicas: the 30 s scale-up stabilization window,
the HPA's 15 s sync period and the lag of a 1 m rate window."""

RULE_OF_THUMB_IDLE = 2
RULE_OF_THUMB_ACTIVE = 8
"""The playbook's warm buffer: about 2 idle replicas per 8 active."""

BURST_ASSUMPTIONS = (
    "Burst: the rate jumps to K×λ and stays there until new replicas are ready "
    "(detect + scale-up); only the replicas already up serve it; the queue starts near empty; "
    "no rejections (a max_queue cap would turn excess wait into 429s)."
)

_P99 = 0.99
_MAX_SEARCH_FACTOR = 1.0e4


@dataclass(frozen=True, slots=True)
class Burst:
    """A burst to absorb with the replicas already up.

    Attributes:
        factor: K, the arrival rate during the burst as a multiple of the base rate, >= 1.
        scale_up_s: Seconds from the autoscaler asking for a replica to it serving
            (pod scheduling, image pull, model load), >= 0.
        detect_s: Seconds from the burst's start to the autoscaler asking, >= 0.
    """

    factor: float = DEFAULT_BURST_FACTOR
    scale_up_s: float = DEFAULT_SCALE_UP_S
    detect_s: float = DEFAULT_DETECT_S

    def __post_init__(self) -> None:
        if not (math.isfinite(self.factor) and self.factor >= 1.0):
            raise ValueError(f"burst factor must be finite and >= 1, got {self.factor!r}")
        for name, value in (("scale_up_s", self.scale_up_s), ("detect_s", self.detect_s)):
            if not (math.isfinite(value) and value >= 0.0):
                raise ValueError(f"{name} must be finite and >= 0, got {value!r}")

    @property
    def window_s(self) -> float:
        """Seconds the burst runs on the replicas already up: detect_s + scale_up_s."""
        return self.detect_s + self.scale_up_s


@dataclass(frozen=True, slots=True)
class BurstWait:
    """The p99 queue wait at the end of a burst window for one replica count.

    Attributes:
        replicas: Replicas up during the window.
        servers: Slots c = replicas · slots per replica.
        burst_rate: K·λ, requests/s.
        utilization: K·λ/(cμ); 1 or more means the backlog grows through the window.
        stationary_p99_s: Allen–Cunneen p99 at K·λ; infinite when utilization >= 1.
        transient_p99_s: p99 backlog at the window's end over the drain rate cμ.
        fluid_backlog: (K·λ − cμ)⁺·T, the backlog without randomness, requests.
    """

    replicas: int
    servers: int
    burst_rate: float
    utilization: float
    stationary_p99_s: float
    transient_p99_s: float
    fluid_backlog: float

    @property
    def p99_wait_s(self) -> float:
        """The planning estimate: the smaller of the stationary and transient p99."""
        return min(self.stationary_p99_s, self.transient_p99_s)

    @property
    def basis(self) -> str:
        """Which estimate :attr:`p99_wait_s` comes from: "stationary" or "transient"."""
        return "stationary" if self.stationary_p99_s <= self.transient_p99_s else "transient"


def _burst_waits(inp: PlanInput, burst: Burst, first_replicas: int) -> Iterator[BurstWait]:
    """Yield BurstWait for first_replicas, first_replicas + 1, … (one Erlang B recursion)."""
    if type(first_replicas) is not int or first_replicas < 1:  # a bool is not a count
        raise ValueError(f"replicas must be an int >= 1, got {first_replicas!r}")
    lam = burst.factor * inp.arrival_rate
    mu = 1.0 / inp.mean_service_s
    load = lam * inp.mean_service_s
    factor = _allen_cunneen_factor(inp.cv_arrival, inp.cv_service)
    variance_rate = lam * (inp.cv_arrival**2 + inp.cv_service**2)
    window = burst.window_s
    erlang_b, k = 1.0, 0
    replicas = first_replicas
    while True:
        c = replicas * inp.slots_per_replica
        while k < c:
            k += 1
            erlang_b = _erlang_b_step(erlang_b, k, load)
        drain = c * mu
        rho = load / c
        stationary = math.inf
        if rho < 1.0:
            p_wait = _erlang_c_from_b(erlang_b, rho)
            stationary = _wait_stats(lam, mu, c, p_wait, factor).p99_wait_s
        backlog = backlog_quantile(_P99, lam - drain, variance_rate, window)
        yield BurstWait(
            replicas=replicas,
            servers=c,
            burst_rate=lam,
            utilization=rho,
            stationary_p99_s=stationary,
            transient_p99_s=backlog / drain,
            fluid_backlog=max(lam - drain, 0.0) * window,
        )
        replicas += 1


def burst_wait(inp: PlanInput, burst: Burst, replicas: int) -> BurstWait:
    """The p99 queue wait at the end of the burst window with ``replicas`` up.

    Args:
        inp: Base traffic, service and SLO.
        burst: The burst.
        replicas: Replicas up during the window, >= 1.
    """
    return next(_burst_waits(inp, burst, replicas))


def rule_of_thumb_warm(active_replicas: int) -> int:
    """The playbook's warm count: ⌈active · 2/8⌉ idle replicas."""
    return math.ceil(active_replicas * RULE_OF_THUMB_IDLE / RULE_OF_THUMB_ACTIVE)


def max_burst_factor(inp: PlanInput, burst: Burst, replicas: int) -> float:
    """The largest burst factor K whose window p99 with ``replicas`` up meets the SLO.

    Bisection on K (the p99 only grows with K) to three significant digits; the
    burst's own factor is ignored. Returns 0 when even K = 1 misses the SLO,
    and the search cap (1e4) when nothing below it does.

    Args:
        inp: Base traffic, service and SLO.
        burst: Supplies the window (detect_s + scale_up_s).
        replicas: Replicas up, >= 1.
    """

    def meets(k: float) -> bool:
        return burst_wait(inp, replace(burst, factor=k), replicas).p99_wait_s <= inp.p99_wait_slo_s

    if not meets(1.0):
        return 0.0
    lo, hi = 1.0, 2.0
    while meets(hi):
        if hi >= _MAX_SEARCH_FACTOR:
            return _MAX_SEARCH_FACTOR
        lo, hi = hi, min(2.0 * hi, _MAX_SEARCH_FACTOR)
    lo, _ = bisect_boundary(meets, lo, hi, 5e-4)
    return lo


@dataclass(frozen=True, slots=True)
class WarmPlan:
    """How many replicas to keep idle for a burst, next to the playbook's 2-per-8.

    Attributes:
        capacity: The base plan (replicas meeting the SLO at the base rate).
        burst: The burst planned for.
        warm: Fewest extra replicas whose window p99 meets the SLO.
        planned: The burst wait at base + warm replicas.
        rule_of_thumb_warm: ⌈base · 2/8⌉.
        rule_of_thumb: The burst wait at base + rule_of_thumb_warm replicas.
        rule_of_thumb_max_factor: Largest burst factor the rule's replicas absorb.
        rows: Burst waits at warm = 0, the rule's count, warm − 1 and warm (sorted).
        burst_replicas: Replicas meeting the SLO at K·λ for good (what the
            autoscaler must be able to reach); None if more than max_replicas.
    """

    capacity: PlanResult
    burst: Burst
    warm: int
    planned: BurstWait
    rule_of_thumb_warm: int
    rule_of_thumb: BurstWait
    rule_of_thumb_max_factor: float
    rows: tuple[BurstWait, ...]
    burst_replicas: int | None

    @property
    def base_replicas(self) -> int:
        """Replicas meeting the SLO at the base rate (the capacity plan's answer)."""
        return self.capacity.replicas

    @property
    def min_replicas(self) -> int:
        """Replicas to keep up: base + warm."""
        return self.capacity.replicas + self.warm


def plan_warm_buffer(capacity: PlanResult, burst: Burst) -> WarmPlan:
    """Find the fewest warm replicas that keep the burst's window p99 within the SLO.

    Tries warm = 0, 1, … on top of ``capacity.replicas``; the window p99 never
    rises with more replicas, so the first that meets the SLO is the minimum.
    With K = 1 that is 0, since the base replicas meet the SLO at λ.

    Args:
        capacity: The base plan from :func:`sluicegate.planner.queueing.plan_capacity`.
        burst: The burst to absorb.

    Raises:
        PlanInfeasibleError: If more than ``max_replicas`` in all would be needed.
    """
    inp = capacity.input
    base = capacity.replicas
    seen: list[BurstWait] = []
    for wait in _burst_waits(inp, burst, base):
        seen.append(wait)
        if wait.p99_wait_s <= inp.p99_wait_slo_s:
            break
        if wait.replicas >= inp.max_replicas:
            raise PlanInfeasibleError(
                f"a {burst.factor:g}× burst for {burst.window_s:g} s needs more than "
                f"max_replicas = {inp.max_replicas} replicas up: at {wait.replicas} the p99 "
                f"wait is {wait.p99_wait_s:.4g} s; raise max_replicas, the SLO, or cut "
                "scale-up time"
            )
    warm = len(seen) - 1

    def at(extra: int) -> BurstWait:
        return seen[extra] if extra < len(seen) else burst_wait(inp, burst, base + extra)

    rule = rule_of_thumb_warm(base)
    try:
        burst_replicas: int | None = plan_capacity(
            replace(inp, arrival_rate=burst.factor * inp.arrival_rate)
        ).replicas
    except PlanInfeasibleError:
        burst_replicas = None
    return WarmPlan(
        capacity=capacity,
        burst=burst,
        warm=warm,
        planned=seen[-1],
        rule_of_thumb_warm=rule,
        rule_of_thumb=at(rule),
        rule_of_thumb_max_factor=max_burst_factor(inp, burst, base + rule),
        rows=tuple(at(extra) for extra in sorted({0, rule, max(warm - 1, 0), warm})),
        burst_replicas=burst_replicas,
    )
