"""A replica's service time from the engine model, for the planner's queueing formulas.

``sluicegate plan --preset P --workload W`` does not take the mean service time and its
variability on faith: it runs the simulator's saturation measurement (``sim/capacity``)
of one replica of engine ``P`` behind a gateway cap of ``--slots``, on requests like
``W``'s, and reads each completed request's service — gateway admission to its end,
the engine's prefill (attention included), decode steps shared with the batch and the
request's fixed overheads. Their mean and coefficient of variation are the planner's
``service_s`` and ``cv_service``; the run's completions per second are reported beside
them as the replica's capacity.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from sluicegate.config import parse_config
from sluicegate.engine.engine_config import EngineConfig
from sluicegate.outcomes import COMPLETED, WorkloadRequest
from sluicegate.sim.capacity import (
    MIN_SAMPLE,
    SAMPLE_PER_SLOT,
    saturation_sample,
    saturation_spec,
    steady_rate,
)
from sluicegate.sim.virtual_driver import simulate

_MODEL = "planned"


@dataclass(frozen=True, slots=True)
class ServiceEstimate:
    """What the engine model says one replica's service looks like.

    Attributes:
        mean_s: mean service time (admission to end) of a request.
        cv: its coefficient of variation (standard deviation ÷ mean).
        capacity_rps: completions per second the replica sustained under backlog.
        requests: requests in the saturation run.
    """

    mean_s: float
    cv: float
    capacity_rps: float
    requests: int


def _config_text(slots: int) -> str:
    return (
        f"models:\n  - name: {_MODEL}\n    max_concurrency: {slots}\n"
        "    max_inflight_tokens: off\n"
        f"    backends: [{{name: replica, url: 'http://127.0.0.1:9', max_concurrency: {slots}}}]\n"
        f"    lanes: [{{name: shared, max_concurrency: {slots}}}]\n"
    )


def service_from_model(
    engine: EngineConfig, workload: Sequence[WorkloadRequest], slots: int
) -> ServiceEstimate:
    """Service time of one replica of ``engine`` with ``slots`` requests admitted at once,
    on ``workload``'s request mix (module docstring).

    Raises:
        ValueError: an empty workload, ``slots`` < 1, or too few completions to measure.
    """
    if slots < 1:
        raise ValueError(f"slots must be >= 1, got {slots}")
    if not workload:
        raise ValueError("the workload has no requests")
    spec = saturation_spec(parse_config(_config_text(slots)).scheduler_spec(), _MODEL)
    mix = [dataclasses.replace(r, lane="shared", tenant="default") for r in workload]
    sample = saturation_sample(mix, max(MIN_SAMPLE, SAMPLE_PER_SLOT * slots))
    result = simulate(spec, _MODEL, sample, engine, 1, seed=0)
    done = [r for r in result.records if r.outcome == COMPLETED]
    service = [
        r.finish_s - r.admit_s for r in done if r.finish_s is not None and r.admit_s is not None
    ]
    rate = steady_rate([r.finish_s for r in done if r.finish_s is not None])
    if rate is None or len(service) < 2:
        raise ValueError("too few requests completed to measure the service time")
    mean = statistics.fmean(service)
    return ServiceEstimate(mean, statistics.pstdev(service) / mean, rate[0], len(sample))
