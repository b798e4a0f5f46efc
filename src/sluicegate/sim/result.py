"""What one simulation run produced: each request's outcome, time series, engine totals."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from sluicegate.core.ticket import Outcome
from sluicegate.outcomes import RequestOutcome
from sluicegate.sim.prefix_hits import PrefixCounts

PREEMPTED = Outcome.PREEMPTED.value
TOO_LARGE = "too_large"
"""Outcome of a request the engine could never run: ``EngineConfig.check_request`` refuses it
(prompt + max_tokens beyond the KV capacity, or an empty prompt)."""


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
        records: one per workload request, in workload order; every one has a deadline.
        samples: the scrape-time series.
        start_s: first arrival.
        end_s: when the last request ended (or arrived, if later).
        busy_s: per replica, time with a step in flight.
        slot_s: per replica, ∫ running-batch size dt.
        engine_steps: engine steps taken over all replicas.
        engine_preemptions: recompute preemptions inside the engines (KV exhausted).
        prompt_tokens_queried: prompt tokens looked up in the engines' prefix caches
            (0 when the workload carries no block hashes).
        prompt_tokens_cached: of those, tokens found cached, whose prefill was skipped.
        estimated_wait_s: by request index, the scheduler's estimated wait when it queued
            the request (``Queued.estimated_wait_s``, kept in lanes with ``shed_hopeless``);
            requests admitted at once or refused, and other lanes' requests, have none.
        prefix_by_replica: replica name → its prefix cache's lookups, tokens and requests
            (``sim/prefix_hits.py``); the two token totals above are their sums.
    """

    model: str
    policies: Mapping[str, str]
    slo_s: Mapping[str, float]
    tenant_weights: Mapping[str, float]
    replicas: int
    max_num_seqs: int
    records: tuple[RequestOutcome, ...]
    samples: Samples
    start_s: float
    end_s: float
    busy_s: tuple[float, ...]
    slot_s: tuple[float, ...]
    engine_steps: int
    engine_preemptions: int
    prompt_tokens_queried: int
    prompt_tokens_cached: int
    estimated_wait_s: Mapping[int, float] = field(default_factory=dict)
    prefix_by_replica: Mapping[str, PrefixCounts] = field(default_factory=dict)

    @property
    def prefix_hit_rate(self) -> float:
        """Cached ÷ queried prompt tokens over all replicas; 0 when nothing was queried."""
        return self.prompt_tokens_cached / max(self.prompt_tokens_queried, 1)

    @property
    def prefix_request_hit_rate(self) -> float:
        """Admissions with a cached block ÷ admissions that looked a cache up, over all
        replicas; 0 when nothing was looked up."""
        total = PrefixCounts.total(self.prefix_by_replica.values())
        return total.hit_requests / max(total.requests, 1)

    @property
    def span_s(self) -> float:
        """Simulated time from the first arrival until the last request ended (at least 1 ns)."""
        return max(self.end_s - self.start_s, 1e-9)
