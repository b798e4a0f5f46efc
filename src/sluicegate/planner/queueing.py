"""Capacity planning from queueing formulas: replicas, queue cap and timeout.

The planner answers "how many replicas, what queue cap, what timeout" for one
model from its arrival rate, service-time mean and variability, the number of
requests a replica serves well at once (its *slots*) and a p99 queue-wait SLO.
Every slot is one server of a G/G/c queue with ``c = replicas · slots``:

* Erlang C gives the probability of waiting in M/M/c,
  ``C(c, a) = (aᶜ/c!)/(1−ρ) / (Σ_{k<c} aᵏ/k! + (aᶜ/c!)/(1−ρ))`` with offered
  load ``a = λ/μ`` and utilization ``ρ = a/c < 1``; the wait of those who wait
  is exponential with rate ``cμ − λ``, so ``P(W_q > t) = C·e^{−(cμ−λ)t}``.
* Allen–Cunneen scales the M/M/c wait to G/G/c by ``(c_a² + c_s²)/2``.
* Little's law turns a mean wait into a mean queue length, ``L_q = λ·W_q``.

Everything here is pure computation; :mod:`sluicegate.planner.presentation` renders a
plan as a rich table and draws the p99-versus-utilization curve.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from sluicegate.errors import SluicegateError

__all__ = [
    "ASSUMPTIONS",
    "TIMEOUT_SLO_MULTIPLE",
    "PlanInfeasibleError",
    "PlanInput",
    "PlanResult",
    "WaitStats",
    "allen_cunneen_wait",
    "erlang_c",
    "mmc_wait",
    "plan_capacity",
]

ASSUMPTIONS = (
    "Assumes renewal (Poisson when cv_arrival=1) arrivals, i.i.d. service times, FCFS, "
    "no abandonment or retries; Allen–Cunneen and its exponential tail are approximations; "
    "engines batch, so slots per replica is a fit calibrated from measurements, not a guarantee."
)

TIMEOUT_SLO_MULTIPLE = 2.0
"""Queue timeout recommended by :func:`plan_capacity`, as a multiple of the p99-wait SLO."""


class PlanInfeasibleError(SluicegateError, ValueError):
    """No replica count within the search limit meets the p99-wait SLO."""


@dataclass(frozen=True, slots=True)
class WaitStats:
    """Queue-wait statistics of a c-server queue at one operating point.

    The waiting-time distribution is modelled as an atom at zero plus an
    exponential tail: ``P(W_q > t) = p_wait · e^{−t / wait_scale_s}``, so
    ``W_q = p_wait · wait_scale_s`` and ``L_q = λ · W_q``.

    Attributes:
        servers: Number of servers (slots) c.
        arrival_rate: Arrival rate λ in requests per second.
        utilization: ρ = λ / (cμ), in [0, 1).
        p_wait: Probability that an arrival waits at all.
        mean_wait_s: Mean queue wait W_q in seconds.
        p99_wait_s: 99th percentile of the queue wait in seconds.
        mean_queue_len: Mean number waiting L_q (Little's law).
        wait_scale_s: Mean wait of the arrivals that do wait, in seconds.
    """

    servers: int
    arrival_rate: float
    utilization: float
    p_wait: float
    mean_wait_s: float
    p99_wait_s: float
    mean_queue_len: float
    wait_scale_s: float

    def wait_quantile(self, q: float) -> float:
        """Return the q-quantile of the queue wait in seconds.

        Solves ``p_wait · e^{−t/wait_scale_s} = 1 − q`` for t, which is 0 when
        ``p_wait ≤ 1 − q`` (at least a fraction q of arrivals never wait).

        Args:
            q: Quantile in [0, 1).

        Raises:
            ValueError: If q is outside [0, 1).
        """
        if not 0.0 <= q < 1.0:
            raise ValueError(f"quantile q must be in [0, 1), got {q!r}")
        return _quantile(self.p_wait, self.wait_scale_s, q)

    def p_wait_exceeds(self, t: float) -> float:
        """Return ``P(W_q > t) = p_wait · e^{−t/wait_scale_s}`` for a wait t ≥ 0 seconds."""
        if t < 0.0:
            raise ValueError(f"wait t must be >= 0, got {t!r}")
        if self.wait_scale_s == 0.0:
            return 0.0
        return self.p_wait * math.exp(-t / self.wait_scale_s)


def _check_servers(c: int) -> None:
    if isinstance(c, bool) or not isinstance(c, int) or c < 1:
        raise ValueError(f"number of servers c must be an int >= 1, got {c!r}")


def _check_nonnegative(name: str, value: float) -> None:
    if not (math.isfinite(value) and value >= 0.0):
        raise ValueError(f"{name} must be finite and >= 0, got {value!r}")


def _check_positive(name: str, value: float) -> None:
    if not (math.isfinite(value) and value > 0.0):
        raise ValueError(f"{name} must be finite and > 0, got {value!r}")


def _erlang_b_step(b_prev: float, k: int, a: float) -> float:
    """One step of the Erlang B recursion: ``B(k) = a·B(k−1) / (k + a·B(k−1))``, ``B(0) = 1``.

    Each step is a ratio of non-negative numbers, so no factorial or power is
    formed and nothing overflows; B only shrinks towards 0 as k grows.
    """
    return a * b_prev / (k + a * b_prev)


def _erlang_c_from_b(b: float, rho: float) -> float:
    """Convert Erlang B to Erlang C at the same c: ``C = B / (1 − ρ(1 − B))``."""
    return b / (1.0 - rho * (1.0 - b))


def erlang_c(c: int, a: float) -> float:
    """Probability that an arrival waits in M/M/c (Erlang C).

    ``C(c, a) = (aᶜ/c!)/(1−ρ) / (Σ_{k<c} aᵏ/k! + (aᶜ/c!)/(1−ρ))`` with
    ``ρ = a/c``, computed stably through the Erlang B recursion
    ``B(k) = a·B(k−1)/(k + a·B(k−1))``, ``B(0) = 1``, then
    ``C = B(c) / (1 − ρ(1 − B(c)))``. Costs O(c); fine for c in the tens of
    thousands.

    Args:
        c: Number of servers, >= 1.
        a: Offered load λ/μ in Erlangs, >= 0.

    Raises:
        ValueError: If c < 1, a < 0, or the queue is unstable (ρ = a/c ≥ 1).
    """
    _check_servers(c)
    _check_nonnegative("offered load a", a)
    rho = a / c
    if rho >= 1.0:
        raise ValueError(
            f"unstable queue: utilization rho = a/c = {a!r}/{c} = {rho:.4f} must be < 1"
        )
    b = 1.0
    for k in range(1, c + 1):
        b = _erlang_b_step(b, k, a)
    return _erlang_c_from_b(b, rho)


def _quantile(p_wait: float, scale_s: float, q: float) -> float:
    tail = 1.0 - q
    if p_wait <= tail or scale_s == 0.0:
        return 0.0
    return scale_s * math.log(p_wait / tail)


def _wait_stats(lam: float, mu: float, c: int, p_wait: float, factor: float) -> WaitStats:
    """Build WaitStats whose conditional wait is the M/M/c one, ``1/(cμ−λ)``, times factor."""
    scale = factor / (c * mu - lam)
    return WaitStats(
        servers=c,
        arrival_rate=lam,
        utilization=lam / (c * mu),
        p_wait=p_wait,
        mean_wait_s=p_wait * scale,
        p99_wait_s=_quantile(p_wait, scale, 0.99),
        mean_queue_len=lam * p_wait * scale,
        wait_scale_s=scale,
    )


def mmc_wait(lam: float, mu: float, c: int) -> WaitStats:
    """Queue-wait statistics of M/M/c.

    ``W_q = C(c, λ/μ)/(cμ − λ)``, ``P(W_q > t) = C·e^{−(cμ−λ)t}``,
    ``L_q = λ·W_q``.

    Args:
        lam: Arrival rate λ (requests/s), >= 0.
        mu: Service rate μ of one server (requests/s), > 0.
        c: Number of servers, >= 1.

    Raises:
        ValueError: On invalid arguments or ρ = λ/(cμ) ≥ 1.
    """
    _check_nonnegative("arrival rate lam", lam)
    _check_positive("service rate mu", mu)
    return _wait_stats(lam, mu, c, erlang_c(c, lam / mu), 1.0)


def _allen_cunneen_factor(cv_arrival: float, cv_service: float) -> float:
    _check_nonnegative("cv_arrival", cv_arrival)
    _check_nonnegative("cv_service", cv_service)
    return (cv_arrival**2 + cv_service**2) / 2.0


def allen_cunneen_wait(
    lam: float, mean_service_s: float, cv_arrival: float, cv_service: float, c: int
) -> WaitStats:
    """Approximate queue-wait statistics of G/G/c (Allen–Cunneen).

    ``W_q ≈ C(c, a)/(cμ − λ) · (c_a² + c_s²)/2`` with ``μ = 1/mean_service_s``.
    The probability of waiting is kept at Erlang C and the time axis of the
    M/M/c exponential tail is stretched by the same factor,
    ``P(W_q > t) ≈ C·e^{−(cμ−λ)t/f}``, so the tail's mean equals the
    Allen–Cunneen mean. That tail is an approximation, not a theorem. With
    c = 1 this is Kingman's formula (exact in the mean for M/G/1).

    Args:
        lam: Arrival rate λ (requests/s), >= 0.
        mean_service_s: Mean service time 1/μ in seconds, > 0.
        cv_arrival: Coefficient of variation of inter-arrival times c_a, >= 0.
        cv_service: Coefficient of variation of service times c_s, >= 0.
        c: Number of servers, >= 1.

    Raises:
        ValueError: On invalid arguments or ρ ≥ 1.
    """
    _check_nonnegative("arrival rate lam", lam)
    _check_positive("mean_service_s", mean_service_s)
    factor = _allen_cunneen_factor(cv_arrival, cv_service)
    mu = 1.0 / mean_service_s
    return _wait_stats(lam, mu, c, erlang_c(c, lam * mean_service_s), factor)


@dataclass(frozen=True, slots=True)
class PlanInput:
    """What the operator knows about one model's traffic and target.

    Attributes:
        arrival_rate: Mean request arrival rate λ, requests/s, > 0.
        mean_service_s: Mean time one slot spends on a request, seconds, > 0.
        cv_service: Coefficient of variation of service time (std/mean), >= 0.
        slots_per_replica: Concurrent requests one replica serves well, >= 1.
        p99_wait_slo_s: Target p99 of queue wait, seconds, > 0.
        cv_arrival: Coefficient of variation of inter-arrival times; 1 is Poisson.
        max_replicas: Largest replica count to consider, >= 1.
    """

    arrival_rate: float
    mean_service_s: float
    cv_service: float
    slots_per_replica: int
    p99_wait_slo_s: float
    cv_arrival: float = 1.0
    max_replicas: int = 1000

    def __post_init__(self) -> None:
        _check_positive("arrival_rate", self.arrival_rate)
        _check_positive("mean_service_s", self.mean_service_s)
        _check_nonnegative("cv_service", self.cv_service)
        _check_nonnegative("cv_arrival", self.cv_arrival)
        _check_positive("p99_wait_slo_s", self.p99_wait_slo_s)
        for name, value in (
            ("slots_per_replica", self.slots_per_replica),
            ("max_replicas", self.max_replicas),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an int >= 1, got {value!r}")

    @property
    def offered_load(self) -> float:
        """Offered load a = λ · mean_service_s, in busy slots (Erlangs)."""
        return self.arrival_rate * self.mean_service_s


@dataclass(frozen=True, slots=True)
class PlanResult:
    """The recommended operating point for a :class:`PlanInput`.

    Attributes:
        input: The planning input.
        replicas: Smallest replica count meeting the SLO.
        stable_replicas: Smallest replica count with ρ < 1 (keeps up, ignores the SLO).
        gg: Allen–Cunneen G/G/c statistics at ``replicas`` (the basis of the choice).
        mm: M/M/c statistics at the same point, for comparison.
        max_queue: Recommended queue cap (requests waiting, all replicas).
        queue_timeout_s: Recommended queue timeout in seconds.
        timeout_drop_fraction: Modelled fraction of requests the timeout would cut.
        assumptions: One line naming the modelling assumptions.
    """

    input: PlanInput
    replicas: int
    stable_replicas: int
    gg: WaitStats
    mm: WaitStats
    max_queue: int
    queue_timeout_s: float
    timeout_drop_fraction: float
    assumptions: str = ASSUMPTIONS

    @property
    def servers(self) -> int:
        """Total slots c = replicas · slots_per_replica."""
        return self.gg.servers


def _recommend(inp: PlanInput, replicas: int, stable: int, p_wait: float) -> PlanResult:
    c = replicas * inp.slots_per_replica
    mu = 1.0 / inp.mean_service_s
    factor = _allen_cunneen_factor(inp.cv_arrival, inp.cv_service)
    gg = _wait_stats(inp.arrival_rate, mu, c, p_wait, factor)
    mm = _wait_stats(inp.arrival_rate, mu, c, p_wait, 1.0)
    timeout = TIMEOUT_SLO_MULTIPLE * inp.p99_wait_slo_s
    return PlanResult(
        input=inp,
        replicas=replicas,
        stable_replicas=stable,
        gg=gg,
        mm=mm,
        max_queue=max(1, math.ceil(c * mu * inp.p99_wait_slo_s)),
        queue_timeout_s=timeout,
        timeout_drop_fraction=gg.p_wait_exceeds(timeout),
    )


def plan_capacity(inp: PlanInput) -> PlanResult:
    """Find the fewest replicas whose Allen–Cunneen p99 queue wait meets the SLO.

    Replicas n = 1, 2, … are tried in order with ``c = n · slots`` servers;
    the first with ``ρ < 1`` and G/G/c p99 wait ≤ SLO is chosen (p99 falls as
    c grows at fixed load, so it is the minimum). One Erlang B recursion runs
    up to the answer, so the whole search costs O(replicas · slots).

    Recommendations:
        * ``max_queue = ceil(c · μ · SLO)``: when all c slots are busy they
          drain c·μ requests per second, so an arrival that finds more than
          c·μ·SLO requests ahead of it (FCFS) is expected to wait past the SLO.
          Rejecting it at once with 429 is kinder than a hopeless wait; at an
          operating point that meets the SLO such a backlog is rare.
        * ``queue_timeout_s = 2 · SLO``: a backstop for when the model is
          wrong (a replica down, longer outputs than planned). Far enough past
          the SLO that requests within the p99 are never cut
          (``timeout_drop_fraction`` is the modelled share that is), yet close
          enough that a stalled queue sheds instead of holding clients for minutes.

    Args:
        inp: The planning input.

    Raises:
        PlanInfeasibleError: If no count up to ``inp.max_replicas`` meets the SLO.
    """
    a = inp.offered_load
    slots = inp.slots_per_replica
    stable = math.floor(a / slots) + 1
    k = 0
    b = 1.0
    last: WaitStats | None = None
    factor = _allen_cunneen_factor(inp.cv_arrival, inp.cv_service)
    mu = 1.0 / inp.mean_service_s
    for n in range(1, inp.max_replicas + 1):
        c = n * slots
        while k < c:
            k += 1
            b = _erlang_b_step(b, k, a)
        rho = a / c
        if rho >= 1.0:
            continue
        p_wait = _erlang_c_from_b(b, rho)
        last = _wait_stats(inp.arrival_rate, mu, c, p_wait, factor)
        if last.p99_wait_s <= inp.p99_wait_slo_s:
            return _recommend(inp, n, stable, p_wait)
    detail = (
        f"at {inp.max_replicas} replicas p99 wait is {last.p99_wait_s:.4g} s"
        if last is not None
        else f"even {inp.max_replicas} replicas cannot keep up (rho >= 1)"
    )
    raise PlanInfeasibleError(
        f"no replica count <= {inp.max_replicas} meets p99 wait <= "
        f"{inp.p99_wait_slo_s:.4g} s: {detail}; raise max_replicas or the SLO"
    )
