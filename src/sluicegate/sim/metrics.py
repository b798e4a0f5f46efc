"""What a simulation run produced, per request and over time, and its summary statistics.

Definitions (every figure in the report follows them):

* **queue wait** = first admission − arrival, over requests that were admitted;
  **TTFT** = first token − arrival and **end-to-end** = finish − arrival, over
  completed requests. TTFT and end-to-end include the scheduler's queue wait
  and any wait inside the engine.
* **Percentiles** use numpy's ``method="linear"`` (the Hyndman–Fan type 7
  estimator): p99.9 of fewer than 1,000 samples interpolates between the top two.
* **SLO attainment** = (completed requests with finish ≤ deadline) / (all
  requests of the group, rejected, expired and preempted included): a request
  turned away has missed its SLO. The deadline is the request's own, else
  arrival + its lane's ``slo_ms``.
* **Goodput** = completed-within-deadline requests (and their output tokens)
  per second of simulated span; **throughput** counts every output token
  served. The span runs from the first arrival until the last request ended.
* **Jain's fairness index** over the tenants of a group, of
  ``x_t = served_t / weight_t`` where ``served_t`` is the tenant's VTC-weighted
  service (prompt tokens × 1 + generated tokens × 2, as the ``fair`` policy
  counts it) of every request that ran, completed or preempted:
  ``J = (Σx)² / (n·Σx²)`` in ``[1/n, 1]``. It measures equal *service*, so it is
  meaningful when tenants are backlogged; a tenant that asks for less
  legitimately gets less.
* **Utilization** = busy fraction: time a replica had a step in flight over
  replicas × span. **Batch occupancy** = time-average of (sequences in the
  running batch) / ``max_num_seqs``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from sluicegate.core.queues import VTC_INPUT_WEIGHT, VTC_OUTPUT_WEIGHT
from sluicegate.core.ticket import Outcome, TicketId
from sluicegate.sim.request import WorkloadRequest

COMPLETED = Outcome.COMPLETED.value
PREEMPTED = Outcome.PREEMPTED.value
TOO_LARGE = "too_large"
"""Outcome of a request the engine could never run: ``EngineConfig.check_request`` refuses it
(prompt + max_tokens beyond the KV capacity, or an empty prompt)."""

PERCENTILES = (50.0, 90.0, 99.0, 99.9)


@dataclass(frozen=True, slots=True)
class RequestRecord:
    """One request's fate in a simulation run; times are virtual seconds.

    Attributes:
        index: position in the workload as given.
        tenant: who sent it.
        lane: its lane.
        priority: 0 (critical) … 5 (background).
        outcome: an ``Outcome`` value, or ``"too_large"``.
        arrival_s: arrival time.
        admit_s: first admission by the scheduler, if any.
        first_token_s: first token of the run that completed, if any.
        finish_s: when it ended (completed, rejected, expired or preempted).
        deadline_s: its deadline (own, else arrival + lane SLO).
        prompt_tokens: prompt length.
        output_tokens: the output length it would generate if completed.
        generated_tokens: tokens it actually produced before it ended.
        replica: the replica of its last run, if it ran.
        requeues: times it was preempted and put back in its queue.
    """

    index: int
    tenant: str
    lane: str
    priority: int
    outcome: str
    arrival_s: float
    admit_s: float | None
    first_token_s: float | None
    finish_s: float | None
    deadline_s: float
    prompt_tokens: int
    output_tokens: int
    generated_tokens: int
    replica: str | None
    requeues: int


@dataclass(frozen=True, slots=True)
class Samples:
    """Time series sampled at every scrape.

    Attributes:
        times: sample times.
        queued: per lane, tickets waiting in the scheduler's queue.
        running: per sample, sequences in each replica's running batch.
        waiting: per sample, requests in each replica's own waiting queue.
        kv_usage: per sample, mean KV-cache usage over the replicas.
    """

    times: tuple[float, ...] = ()
    queued: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    running: tuple[tuple[int, ...], ...] = ()
    waiting: tuple[tuple[int, ...], ...] = ()
    kv_usage: tuple[float, ...] = ()


class SimRequest:
    """The driver's mutable record of one request while the simulation runs.

    ``eid`` is the request's id inside the engine: the ticket id, suffixed on
    a re-run after a requeue so a stale in-flight step of the earlier run can
    never be mistaken for the new one.
    """

    __slots__ = ("admit_s", "admitted_s", "backend", "eid", "finish_s", "first_token_s",
                 "generated", "index", "outcome", "requeues", "runs", "target", "ticket_id",
                 "workload")  # fmt: skip

    def __init__(self, index: int, workload: WorkloadRequest) -> None:
        self.index = index
        self.workload = workload
        self.ticket_id = TicketId(str(index))
        self.target = max(1, min(workload.max_tokens, workload.output_tokens))
        self.eid: str = self.ticket_id
        self.outcome = ""
        self.admit_s: float | None = None
        self.admitted_s = 0.0
        self.first_token_s: float | None = None
        self.finish_s: float | None = None
        self.backend: str | None = None
        self.generated = self.requeues = self.runs = 0

    def end(self, outcome: str, now: float) -> None:
        """The request ended with ``outcome`` at ``now``."""
        self.outcome = outcome
        self.finish_s = now

    def record(self, lane_slo_s: float) -> RequestRecord:
        """The frozen record; ``lane_slo_s`` gives the deadline when the request has none."""
        wl = self.workload
        own = wl.deadline_ms
        return RequestRecord(
            index=self.index,
            tenant=wl.tenant,
            lane=wl.lane,
            priority=wl.priority,
            outcome=self.outcome,
            arrival_s=wl.arrival_s,
            admit_s=self.admit_s,
            first_token_s=self.first_token_s,
            finish_s=self.finish_s,
            deadline_s=wl.arrival_s + (lane_slo_s if own is None else own / 1000.0),
            prompt_tokens=wl.prompt_tokens,
            output_tokens=self.target,
            generated_tokens=self.generated,
            replica=self.backend,
            requeues=self.requeues,
        )


class SampleLog:
    """Collects the scrape-time series; ``freeze`` gives the immutable ``Samples``."""

    def __init__(self, lanes: Sequence[str]) -> None:
        self._times: list[float] = []
        self._queued: dict[str, list[int]] = {lane: [] for lane in lanes}
        self._running: list[tuple[int, ...]] = []
        self._waiting: list[tuple[int, ...]] = []
        self._kv: list[float] = []

    def add(
        self,
        now: float,
        queued: Mapping[str, int],
        running: Sequence[int],
        waiting: Sequence[int],
        kv_usage: Sequence[float],
    ) -> None:
        """One sample: queue depth per lane and each replica's engine counters."""
        self._times.append(now)
        for lane, depth in self._queued.items():
            depth.append(queued.get(lane, 0))
        self._running.append(tuple(running))
        self._waiting.append(tuple(waiting))
        self._kv.append(math.fsum(kv_usage) / len(kv_usage) if kv_usage else 0.0)

    def freeze(self) -> Samples:
        """The samples so far."""
        return Samples(
            times=tuple(self._times),
            queued={lane: tuple(depths) for lane, depths in self._queued.items()},
            running=tuple(self._running),
            waiting=tuple(self._waiting),
            kv_usage=tuple(self._kv),
        )


@dataclass(frozen=True, slots=True)
class SimResult:
    """Everything one ``simulate`` run produced.

    Attributes:
        model: the simulated model.
        policies: each lane's ordering policy, in configuration order.
        slo_s: each lane's default SLO in seconds.
        tenant_weights: fair-share weight of every configured tenant.
        replicas: number of engine replicas.
        max_num_seqs: the engine's running-batch cap.
        records: one per workload request, in workload order.
        samples: the scrape-time series.
        start_s: first arrival.
        end_s: when the last request ended (or arrived, if later).
        busy_s: per replica, time with a step in flight.
        slot_s: per replica, ∫ running-batch size dt.
        engine_steps: engine steps taken over all replicas.
        engine_preemptions: recompute preemptions inside the engines (KV exhausted).
    """

    model: str
    policies: Mapping[str, str]
    slo_s: Mapping[str, float]
    tenant_weights: Mapping[str, float]
    replicas: int
    max_num_seqs: int
    records: tuple[RequestRecord, ...]
    samples: Samples
    start_s: float
    end_s: float
    busy_s: tuple[float, ...]
    slot_s: tuple[float, ...]
    engine_steps: int
    engine_preemptions: int

    @property
    def span_s(self) -> float:
        """Simulated time from the first arrival until the last request ended (at least 1 ns)."""
        return max(self.end_s - self.start_s, 1e-9)


@dataclass(frozen=True, slots=True)
class LatencyStats:
    """Mean and percentiles of one latency; ``None`` fields when there are no samples."""

    count: int
    mean: float | None
    p50: float | None
    p90: float | None
    p99: float | None
    p999: float | None

    @classmethod
    def of(cls, values: Sequence[float]) -> LatencyStats:
        """Statistics of ``values`` (numpy linear percentiles)."""
        if not values:
            return cls(0, None, None, None, None, None)
        array = np.asarray(values, dtype=np.float64)
        p50, p90, p99, p999 = (float(x) for x in np.percentile(array, PERCENTILES, method="linear"))
        return cls(len(values), float(array.mean()), p50, p90, p99, p999)


@dataclass(frozen=True, slots=True)
class GroupStats:
    """Summary of one group of requests (all, one lane, or one tenant).

    Attributes:
        requests: requests in the group.
        outcomes: count per outcome (completed, rejected_*, shed, expired, …).
        requeued: requests preempted and run again at least once.
        queue_wait: admission − arrival, over admitted requests.
        ttft: first token − arrival, over completed requests.
        e2e: finish − arrival, over completed requests.
        slo_attainment: completed within deadline / all requests.
        goodput_rps: completed-within-deadline requests per second.
        goodput_tokens_per_s: their output tokens per second.
        throughput_tokens_per_s: every generated token per second.
        fairness: Jain's index over the group's tenants (see module docstring).
    """

    requests: int
    outcomes: Mapping[str, int]
    requeued: int
    queue_wait: LatencyStats
    ttft: LatencyStats
    e2e: LatencyStats
    slo_attainment: float | None
    goodput_rps: float
    goodput_tokens_per_s: float
    throughput_tokens_per_s: float
    fairness: float | None

    @property
    def completed(self) -> int:
        """Requests that completed."""
        return self.outcomes.get(COMPLETED, 0)

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
    """One run's summary: overall, per lane and per tenant, plus engine-level figures."""

    label: str
    rate_multiplier: float
    offered_rps: float
    span_s: float
    replicas: int
    overall: GroupStats
    lanes: Mapping[str, GroupStats]
    tenants: Mapping[str, GroupStats]
    utilization: float
    batch_occupancy: float
    engine_preemptions: int


def jain_index(values: Iterable[float]) -> float | None:
    """Jain's fairness index ``(Σx)² / (n·Σx²)``; ``None`` for no values or all zero."""
    xs = list(values)
    squares = math.fsum(x * x for x in xs)
    if not xs or squares == 0.0:
        return None
    return math.fsum(xs) ** 2 / (len(xs) * squares)


def served_tokens(record: RequestRecord) -> float:
    """VTC-weighted service a request received (0 unless it ran)."""
    if record.outcome not in (COMPLETED, PREEMPTED):
        return 0.0
    return VTC_INPUT_WEIGHT * record.prompt_tokens + VTC_OUTPUT_WEIGHT * record.generated_tokens


def group_stats(
    records: Sequence[RequestRecord], span_s: float, weights: Mapping[str, float]
) -> GroupStats:
    """Summarise ``records`` over ``span_s`` seconds; ``weights`` are tenant weights."""
    outcomes: dict[str, int] = {}
    waits: list[float] = []
    ttfts: list[float] = []
    e2es: list[float] = []
    served: dict[str, float] = {}
    good = good_tokens = tokens = requeued = 0
    for rec in records:
        outcomes[rec.outcome] = outcomes.get(rec.outcome, 0) + 1
        requeued += rec.requeues > 0
        tokens += rec.generated_tokens
        served[rec.tenant] = served.get(rec.tenant, 0.0) + served_tokens(rec)
        if rec.admit_s is not None:
            waits.append(rec.admit_s - rec.arrival_s)
        if rec.outcome == COMPLETED and rec.finish_s is not None:
            e2es.append(rec.finish_s - rec.arrival_s)
            if rec.first_token_s is not None:
                ttfts.append(rec.first_token_s - rec.arrival_s)
            if rec.finish_s <= rec.deadline_s:
                good += 1
                good_tokens += rec.generated_tokens
    shares = [served[t] / weights.get(t, 1.0) for t in sorted(served)]
    return GroupStats(
        requests=len(records),
        outcomes=dict(sorted(outcomes.items())),
        requeued=requeued,
        queue_wait=LatencyStats.of(waits),
        ttft=LatencyStats.of(ttfts),
        e2e=LatencyStats.of(e2es),
        slo_attainment=good / len(records) if records else None,
        goodput_rps=good / span_s,
        goodput_tokens_per_s=good_tokens / span_s,
        throughput_tokens_per_s=tokens / span_s,
        fairness=jain_index(shares),
    )


def _grouped(records: Iterable[RequestRecord], by_lane: bool) -> dict[str, list[RequestRecord]]:
    groups: dict[str, list[RequestRecord]] = {}
    for rec in records:
        groups.setdefault(rec.lane if by_lane else rec.tenant, []).append(rec)
    return groups


def summarize(result: SimResult, *, label: str = "", rate_multiplier: float = 1.0) -> Summary:
    """Summary statistics of one run (see the module docstring for every definition).

    Lanes are listed in configuration order (lanes the workload never used
    included); tenants in name order.
    """
    span = result.span_s
    weights = result.tenant_weights
    lanes = _grouped(result.records, by_lane=True)
    tenants = _grouped(result.records, by_lane=False)
    lane_names = [*result.policies, *sorted(set(lanes) - set(result.policies))]
    arrivals = [rec.arrival_s for rec in result.records]
    arrival_span = max(arrivals) - min(arrivals) if len(arrivals) > 1 else 0.0
    capacity_s = span * result.replicas
    return Summary(
        label=label,
        rate_multiplier=rate_multiplier,
        offered_rps=(len(arrivals) - 1) / arrival_span if arrival_span > 0 else 0.0,
        span_s=span,
        replicas=result.replicas,
        overall=group_stats(result.records, span, weights),
        lanes={name: group_stats(lanes.get(name, []), span, weights) for name in lane_names},
        tenants={name: group_stats(tenants[name], span, weights) for name in sorted(tenants)},
        utilization=math.fsum(result.busy_s) / capacity_s,
        batch_occupancy=math.fsum(result.slot_s) / (capacity_s * result.max_num_seqs),
        engine_preemptions=result.engine_preemptions,
    )
