"""Summary statistics of a simulation run: overall, per lane and per tenant.

Latencies, percentiles, SLO attainment, goodput and throughput follow the one
definition of ``sluicegate.outcomes.stats``, shared with the load generator's report:
a request is good when it completed by its deadline (its own, else arrival + its
lane's ``slo_ms``; every simulated request has one), and every request of the group,
rejected, expired, preempted and too large included, counts in the denominator of SLO
attainment. The span runs from the first arrival until the last request ended. On top
of those, the simulator reports:

* **requeued**: requests preempted and run again at least once.
* **Jain's fairness index** over the tenants of a group, of
  ``x_t = served_t / weight_t`` where ``served_t`` is the tenant's VTC-weighted
  service (prompt tokens × 1 + generated tokens × 2, as the ``fair`` policy
  counts it) of every request that ran, completed or preempted:
  ``J = (Σx)² / (n·Σx²)`` in ``[1/n, 1]``. It measures equal *service*, so it is
  meaningful when tenants are backlogged; a tenant that asks for less
  legitimately gets less.
* **Load ρ** = offered req/s ÷ capacity req/s. Offered is (arrivals − 1) ÷ the
  arrival span; capacity is what ``sim/capacity.py`` measures for the
  configuration and workload (completions per second under backlog), the same
  for every policy of one ``simulate`` command. ρ near or above 1 means queues
  grow whatever the policy.
* **Slot occupancy** = time-average over the span of the requests in the
  engines' running batches ÷ ``slot_cap``, the most that can run at once behind
  the gateway's caps (``sim/capacity.py``).
* **KV usage**: mean and peak, over the scrapes, of the replicas' mean KV-cache
  usage (scrapes run every ``scrape_interval_s`` while work is in flight).
* **Prefix-cache hits**: per replica, the tokens and requests (those with at least one
  block cached) the engines' prefix caches served (``sim/prefix_hits.py``).
* **Any step running**: time some replica's engine had a step in flight ÷
  (replicas × span). It says the engines were not idle, not how full they were.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from sluicegate.core.fair_queue import VTC_INPUT_WEIGHT, VTC_OUTPUT_WEIGHT
from sluicegate.outcomes import COMPLETED, OutcomeStats, RequestOutcome
from sluicegate.sim.prefix_hits import PrefixCounts
from sluicegate.sim.result import PREEMPTED, SimResult


@dataclass(frozen=True, slots=True)
class GroupStats(OutcomeStats):
    """Summary of one group of requests (all, one lane, or one tenant).

    Attributes (besides ``OutcomeStats``'):
        requeued: requests preempted and run again at least once.
        fairness: Jain's index over the group's tenants (see the module docstring).
    """

    requeued: int
    fairness: float | None

    @property
    def preempted(self) -> int:
        """Requests that ended preempted."""
        return self.outcomes.get(PREEMPTED, 0)

    @property
    def rejected(self) -> int:
        """Requests that ended neither completed nor preempted."""
        return self.requests - self.completed - self.preempted


@dataclass(frozen=True, slots=True)
class Summary:
    """One run's summary: overall, per lane and per tenant, plus load and engine figures.

    ``offered_rps``, ``capacity_rps`` (``None`` unless measured), ``load``,
    ``slot_cap`` and ``slot_occupancy`` (``None`` without a cap), ``kv_usage_mean``
    and ``kv_usage_peak`` (``None`` without scrapes), ``any_step_running`` and
    ``prefix_by_replica`` (replica name → its prefix-cache lookups) are defined in the
    module docstring.
    """

    label: str
    rate_multiplier: float
    offered_rps: float
    span_s: float
    replicas: int
    overall: GroupStats
    lanes: Mapping[str, GroupStats]
    tenants: Mapping[str, GroupStats]
    any_step_running: float
    slot_cap: int | None
    slot_occupancy: float | None
    kv_usage_mean: float | None
    kv_usage_peak: float | None
    engine_preemptions: int
    capacity_rps: float | None = None
    prefix_by_replica: Mapping[str, PrefixCounts] = field(default_factory=dict)

    @property
    def load(self) -> float | None:
        """Load ρ = offered req/s ÷ capacity req/s; ``None`` without a capacity."""
        if self.capacity_rps is None or self.capacity_rps <= 0.0:
            return None
        return self.offered_rps / self.capacity_rps


def jain_index(values: Iterable[float]) -> float | None:
    """Jain's fairness index ``(Σx)² / (n·Σx²)``; ``None`` for no values or all zero."""
    xs = list(values)
    squares = math.fsum(x * x for x in xs)
    if not xs or squares == 0.0:
        return None
    return math.fsum(xs) ** 2 / (len(xs) * squares)


def served_tokens(record: RequestOutcome) -> float:
    """VTC-weighted service a request received (0 unless it ran)."""
    if record.outcome not in (COMPLETED, PREEMPTED):
        return 0.0
    return VTC_INPUT_WEIGHT * record.prompt_tokens + VTC_OUTPUT_WEIGHT * record.generated_tokens


def group_stats(
    records: Sequence[RequestOutcome], span_s: float, weights: Mapping[str, float]
) -> GroupStats:
    """Summarise ``records`` over ``span_s`` seconds; ``weights`` are tenant weights."""
    served: dict[str, float] = {}
    requeued = 0
    for rec in records:
        requeued += rec.requeues > 0
        served[rec.tenant] = served.get(rec.tenant, 0.0) + served_tokens(rec)
    shares = [served[t] / weights.get(t, 1.0) for t in sorted(served)]
    return GroupStats.of(records, span_s, requeued=requeued, fairness=jain_index(shares))


def _grouped(records: Iterable[RequestOutcome], by_lane: bool) -> dict[str, list[RequestOutcome]]:
    groups: dict[str, list[RequestOutcome]] = {}
    for rec in records:
        groups.setdefault(rec.lane if by_lane else rec.tenant, []).append(rec)
    return groups


def summarize(
    result: SimResult,
    *,
    label: str = "",
    rate_multiplier: float = 1.0,
    slot_cap: int | None = None,
    capacity_rps: float | None = None,
) -> Summary:
    """Summary statistics of one run (see the module docstring for every definition).

    ``slot_cap`` (``sim.capacity.slot_cap``) and ``capacity_rps``
    (``sim.capacity.measure_capacity``) come from the configuration; without
    them slot occupancy and load are ``None``. Lanes are listed in configuration
    order (lanes the workload never used included); tenants in name order.
    """
    span = result.span_s
    weights = result.tenant_weights
    lanes = _grouped(result.records, by_lane=True)
    tenants = _grouped(result.records, by_lane=False)
    lane_names = [*result.policies, *sorted(set(lanes) - set(result.policies))]
    arrivals = [rec.arrival_s for rec in result.records]
    arrival_span = max(arrivals) - min(arrivals) if len(arrivals) > 1 else 0.0
    capacity_s = span * result.replicas
    kv = result.samples.kv_usage
    return Summary(
        label=label,
        rate_multiplier=rate_multiplier,
        offered_rps=(len(arrivals) - 1) / arrival_span if arrival_span > 0 else 0.0,
        span_s=span,
        replicas=result.replicas,
        overall=group_stats(result.records, span, weights),
        lanes={name: group_stats(lanes.get(name, []), span, weights) for name in lane_names},
        tenants={name: group_stats(tenants[name], span, weights) for name in sorted(tenants)},
        any_step_running=math.fsum(result.busy_s) / capacity_s,
        slot_cap=slot_cap,
        slot_occupancy=math.fsum(result.slot_s) / (span * slot_cap) if slot_cap else None,
        kv_usage_mean=math.fsum(kv) / len(kv) if kv else None,
        kv_usage_peak=max(kv) if kv else None,
        engine_preemptions=result.engine_preemptions,
        capacity_rps=capacity_rps,
        prefix_by_replica=result.prefix_by_replica,
    )
