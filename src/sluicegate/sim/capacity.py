"""Capacity of the configured system on a workload's request mix, and its slot cap.

``measure_capacity`` answers "how many completions per second can these replicas,
behind these gateway caps, sustain on requests like these?" the way a user would
measure it: a short saturation run of the same simulator. It takes an evenly
spaced sample of the workload's own requests (sizes, tenants, lanes and
priorities kept; a short workload is repeated to fill it), makes them all
arrive at once, and counts completions per second over the steady middle of
the drain: between the finish of the first
quarter and of the third quarter of the completions (the start and the
draining tail, with a part-empty batch, are left out). Admission limits that
are not capacity are lifted for the run (queue caps, queue timeouts,
deadlines, shedding, preemption, tenant rate limits) and every lane orders
``fifo`` without fairness, so the figure depends on the configuration and the
workload only, never on the policy under comparison. Concurrency caps (model,
lanes, backends, ``max_inflight_tokens``) and the engine model are kept.
Nothing is cached: the run is deterministic given the seed.

``slot_cap`` is the most requests that can run at once: the smallest of the
model's ``max_concurrency``, the sum of its lanes' ``max_concurrency``, the
replicas' backend caps (when the model's first backend sets one; every replica
inherits it) and replicas × the engine's ``max_num_seqs``. An ``adaptive``
limit is not counted (it moves during a run).
"""

from __future__ import annotations

import dataclasses
from bisect import bisect_right
from collections.abc import Sequence
from dataclasses import dataclass

from sluicegate.core.spec import SchedulerSpec
from sluicegate.engine.engine_config import EngineConfig
from sluicegate.outcomes import COMPLETED, WorkloadRequest
from sluicegate.sim.virtual_driver import simulate

MIN_SAMPLE = 2000
"""Requests in a saturation run at least: on the Azure conversation trace, 2,000 are
within 1% of 20,000's figure, 448 off by up to 8% (a heavy-tailed mix needs many)."""
SAMPLE_PER_SLOT = 16
"""…and at least this many per slot of ``slot_cap``, so the steady middle spans many
turnovers of the running batch."""
_NO_LIMIT_S = 1e9


@dataclass(frozen=True, slots=True)
class Capacity:
    """A measured capacity.

    Attributes:
        rps: completions per second in the steady middle of the saturation run.
        requests: requests in the saturation run.
        window_s: length of the steady middle it was measured over.
    """

    rps: float
    requests: int
    window_s: float


def slot_cap(spec: SchedulerSpec, model: str, replicas: int, max_num_seqs: int) -> int:
    """The most requests of ``model`` that can run at once (see the module docstring)."""
    m = next(m for m in spec.models if m.name == model)
    caps = [m.max_concurrency, sum(lane.max_concurrency for lane in m.lanes)]
    caps.append(replicas * max_num_seqs)
    if m.backends and m.backends[0].max_concurrency is not None:
        caps.append(replicas * m.backends[0].max_concurrency)
    return min(caps)


def saturation_spec(spec: SchedulerSpec, model: str) -> SchedulerSpec:
    """``spec`` with the admission limits that are not capacity lifted (module docstring)."""
    lifted = {
        "policy": "fifo", "fairness": None, "max_queue": 10_000_000,
        "queue_timeout_s": _NO_LIMIT_S, "slo_ms": _NO_LIMIT_S * 1000.0,
        "preemptible": "never", "shed_hopeless": False,
    }  # fmt: skip
    models = tuple(
        m.model_copy(update={"lanes": tuple(lane.model_copy(update=lifted) for lane in m.lanes)})
        if m.name == model
        else m
        for m in spec.models
    )
    unlimited = {"requests_per_s": None, "burst_requests": None}
    unlimited |= {"tokens_per_min": None, "burst_tokens": None}
    tenants = tuple(t.model_copy(update=unlimited) for t in spec.tenants)
    return spec.model_copy(update={"models": models, "tenants": tenants})


def saturation_sample(workload: Sequence[WorkloadRequest], size: int) -> list[WorkloadRequest]:
    """``size`` evenly spaced requests of ``workload``, all arriving at 0 (a workload of
    fewer than ``size`` requests is repeated, each request as often as the others ±1)."""
    n = len(workload)
    picked = [workload[i * n // size] for i in range(size)]
    return [dataclasses.replace(w, arrival_s=0.0, deadline_ms=None) for w in picked]


def steady_rate(finishes: Sequence[float]) -> tuple[float, float] | None:
    """Completions per second between the first- and third-quarter finish times, and
    that window's length; ``None`` with fewer than 4 finishes or an empty window."""
    times = sorted(finishes)
    if len(times) < 4:
        return None
    start, end = times[len(times) // 4], times[3 * len(times) // 4]
    if not end > start:
        return None
    done = bisect_right(times, end) - bisect_right(times, start)
    return done / (end - start), end - start


def measure_capacity(
    spec: SchedulerSpec,
    model: str,
    workload: Sequence[WorkloadRequest],
    engine: EngineConfig,
    replicas: int,
    *,
    seed: int = 0,
    scrape_interval_s: float = 1.0,
    kv_event_delay_s: float = 0.0,
) -> Capacity | None:
    """Completions per second the configuration sustains under backlog on requests
    like ``workload``'s (see the module docstring); ``None`` when too few complete."""
    cap = slot_cap(spec, model, replicas, engine.max_num_seqs)
    sample = saturation_sample(workload, max(MIN_SAMPLE, SAMPLE_PER_SLOT * cap))
    result = simulate(
        saturation_spec(spec, model), model, sample, engine, replicas,
        seed=seed, scrape_interval_s=scrape_interval_s, kv_event_delay_s=kv_event_delay_s,
    )  # fmt: skip
    finishes = [
        r.finish_s for r in result.records if r.outcome == COMPLETED and r.finish_s is not None
    ]
    measured = steady_rate(finishes)
    if measured is None:
        return None
    return Capacity(measured[0], len(sample), measured[1])
