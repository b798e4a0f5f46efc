"""The one summary of a group of ``RequestOutcome``: latency percentiles, SLO attainment, goodput.

Both reports build on it: the simulator's (``sim/run_summary.py``: ``sluicegate simulate``) and
the load generator's (``bench/analysis.py``: ``sluicegate bench``, the demo), each adding
only figures that the other cannot measure. Definitions:

* A request is **good** when it *completed within its deadline*: its outcome is
  ``completed`` and it finished no later than its deadline (its own, else arrival + its
  lane's SLO). A request without any deadline is good when it completes.
* **SLO attainment** = good requests / all requests of the group. Every outcome counts in
  the denominator: rejected, shed, expired, preempted, cancelled, failed upstream, too
  large, timed out or broken off at the client; a request turned away has missed its SLO.
  ``None`` when the group is empty or none of its requests has a deadline.
* **Goodput** = good requests per second of the span, and their generated tokens per
  second. **Throughput** = the generated tokens of every request per second, the partial
  output of preempted or broken-off requests included.
* The **span** every rate is divided by is the caller's: from the first arrival until the
  last request ended, the same for every group of a run, so lane figures add up to the
  overall one.
* **Queue wait** is taken over admitted requests, **TTFT** and **end-to-end** over
  completed ones (``RequestOutcome``).
* **Percentiles** are numpy's ``method="linear"`` (the Hyndman–Fan type 7 estimator): one
  sample is every percentile, and p99.9 of fewer than 1,000 samples interpolates between
  the top two.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Self

import numpy as np

from sluicegate.outcomes.record import COMPLETED, RequestOutcome

PERCENTILES = (50.0, 90.0, 99.0, 99.9)


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
class OutcomeStats:
    """Summary of one group of requests (see the module docstring for every definition).

    Subclasses add the figures of one driver; ``of`` builds them too.

    Attributes:
        requests: requests in the group.
        outcomes: count per outcome, sorted by name.
        queue_wait: admission − arrival, over admitted requests.
        ttft: first token − arrival, over completed requests.
        e2e: finish − arrival, over completed requests.
        slo_attainment: good requests / all requests.
        goodput_rps: good requests per second.
        goodput_tokens_per_s: their generated tokens per second.
        throughput_tokens_per_s: every generated token per second.
    """

    requests: int
    outcomes: Mapping[str, int]
    queue_wait: LatencyStats
    ttft: LatencyStats
    e2e: LatencyStats
    slo_attainment: float | None
    goodput_rps: float
    goodput_tokens_per_s: float
    throughput_tokens_per_s: float

    @property
    def completed(self) -> int:
        """Requests that completed."""
        return self.outcomes.get(COMPLETED, 0)

    @classmethod
    def of(cls, records: Sequence[RequestOutcome], span_s: float, /, **extra: Any) -> Self:
        """Summarise ``records`` over ``span_s`` seconds; ``extra`` are a subclass's own fields."""
        outcomes: dict[str, int] = {}
        waits: list[float] = []
        ttfts: list[float] = []
        e2es: list[float] = []
        good = good_tokens = tokens = with_deadline = 0
        for rec in records:
            outcomes[rec.outcome] = outcomes.get(rec.outcome, 0) + 1
            tokens += rec.generated_tokens
            with_deadline += rec.deadline_s is not None
            wait = rec.queue_wait_s
            if wait is not None:
                waits.append(wait)
            e2e = rec.e2e_s
            if e2e is not None:
                e2es.append(e2e)
                ttft = rec.ttft_s
                if ttft is not None:
                    ttfts.append(ttft)
            if rec.good:
                good += 1
                good_tokens += rec.generated_tokens
        return cls(
            requests=len(records),
            outcomes=dict(sorted(outcomes.items())),
            queue_wait=LatencyStats.of(waits),
            ttft=LatencyStats.of(ttfts),
            e2e=LatencyStats.of(e2es),
            slo_attainment=good / len(records) if with_deadline else None,
            goodput_rps=good / span_s,
            goodput_tokens_per_s=good_tokens / span_s,
            throughput_tokens_per_s=tokens / span_s,
            **extra,
        )
