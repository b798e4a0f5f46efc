"""The fidelity benchmark's figures: per request latencies, live and simulated, their
percentiles, throughput, and the simulator's error against the live run.

A cell (one set-up, load and policy) has ten figures: TTFT, TPOT and end to end at
p50/p90/p99, and output throughput. TPOT is a request's (e2e − TTFT) ÷ (tokens − 1),
over requests with at least two tokens; throughput is the output tokens of the
completed requests over the time from the first arrival to the last completion.
The error of a figure is |simulated − live| ÷ live.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from sluicegate.bench.records import RequestRecord
from sluicegate.sim.result import SimResult

QUANTILES = (50, 90, 99)
METRICS = ("TTFT", "TPOT", "e2e")
FIGURES = (*(f"{m} p{q}" for m in METRICS for q in QUANTILES), "throughput")
"""The figures of a cell, in table order; latencies in ms, throughput in tokens/s."""


@dataclass(frozen=True)
class Latencies:
    """One run's per-request times (seconds) and its output throughput."""

    ttft: list[float]
    tpot: list[float]
    e2e: list[float]
    tokens_per_s: float
    failed: int

    def figures(self) -> dict[str, float]:
        """The cell's ten figures (``FIGURES``)."""
        out: dict[str, float] = {}
        for metric, values in (("TTFT", self.ttft), ("TPOT", self.tpot), ("e2e", self.e2e)):
            for q in QUANTILES:
                out[f"{metric} p{q}"] = float(np.percentile(values, q)) * 1000.0
        out["throughput"] = self.tokens_per_s
        return out


def live_latencies(records: Sequence[RequestRecord]) -> Latencies:
    """What the load generator measured, over its successful requests."""
    ok = [r for r in records if r.ok and r.ttft_s is not None]
    end = max(r.scheduled_s + r.launch_lag_s + r.e2e_s for r in ok)
    start = min(r.scheduled_s for r in records)
    tokens = sum(r.output_tokens for r in ok)
    return Latencies(
        ttft=[r.ttft_s for r in ok if r.ttft_s is not None],
        tpot=[
            (r.e2e_s - r.ttft_s) / (r.output_tokens - 1)
            for r in ok
            if r.ttft_s is not None and r.output_tokens > 1
        ],
        e2e=[r.e2e_s for r in ok],
        tokens_per_s=tokens / (end - start),
        failed=len(records) - len(ok),
    )


def sim_latencies(result: SimResult) -> Latencies:
    """The same figures from the simulator's records of its completed requests."""
    done = [
        r
        for r in result.records
        if r.outcome == "completed" and r.first_token_s is not None and r.finish_s is not None
    ]
    end = max(r.finish_s for r in done if r.finish_s is not None)
    start = min(r.arrival_s for r in result.records)
    ttft, tpot, e2e = [], [], []
    for r in done:
        assert r.first_token_s is not None
        assert r.finish_s is not None
        ttft.append(r.first_token_s - r.arrival_s)
        e2e.append(r.finish_s - r.arrival_s)
        if r.generated_tokens > 1:
            tpot.append((r.finish_s - r.first_token_s) / (r.generated_tokens - 1))
    tokens = sum(r.generated_tokens for r in done)
    return Latencies(ttft, tpot, e2e, tokens / (end - start), len(result.records) - len(done))


def errors(live: dict[str, float], sim: dict[str, float]) -> dict[str, float]:
    """|simulated − live| ÷ live per figure."""
    return {name: abs(sim[name] - live[name]) / live[name] for name in FIGURES}


def summary(all_errors: Sequence[float]) -> tuple[float, float]:
    """Median and largest absolute error over every figure of every cell."""
    values = np.asarray(all_errors)
    return float(np.median(values)), float(values.max())
