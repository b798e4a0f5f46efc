"""The latency phase of ``bench_overhead.py``: the same small chats sent to every target,
interleaved slot by slot, non-streaming and streaming, with the percentiles, the latency
each proxy adds over a direct call and the CPU each request cost it."""

from __future__ import annotations

import argparse
import asyncio
import math
import random
import time
from collections.abc import Callable, Coroutine, Sequence
from typing import Any

from rich.console import Console

from overhead_stack import MODEL, PROMPT_TOKENS, TARGETS, child_pids
from proc_usage import cpu_seconds
from sluicegate.bench.loadgen import LoadResult, run_load
from sluicegate.bench.records import RequestRecord
from sluicegate.outcomes import WorkloadRequest
from tables import Grid, cells, percentile_ms, us


def latency_schedule(n: int, seed: int) -> list[WorkloadRequest]:
    """``n`` small non-streaming chats: a 16-token prompt, max_tokens 1–4 (seeded)."""
    rng = random.Random(seed)
    sizes = [rng.randint(1, 4) for _ in range(n)]
    return [WorkloadRequest(0.0, PROMPT_TOKENS, k, k) for k in sizes]


async def interleaved(
    urls: dict[str, str], schedule: Sequence[WorkloadRequest], rate: float, *, stream: bool
) -> dict[str, LoadResult]:
    """Send ``schedule`` to every target; request i of target k starts at ``(i + θ)/rate``.

    θ = ((k + i) mod 3) / 3: each slot's three requests are a third of a gap apart,
    and which target goes first rotates from slot to slot.
    """
    runs: list[Coroutine[Any, Any, LoadResult]] = []
    for k, name in enumerate(TARGETS):
        timed = [
            WorkloadRequest(
                (i + ((k + i) % 3) / 3) / rate, r.prompt_tokens, r.output_tokens, r.max_tokens
            )
            for i, r in enumerate(schedule)
        ]
        options: dict[str, Any] = {"model": MODEL, "api_keys": {}, "timeout_s": 30.0}
        runs.append(run_load(timed, base_url=urls[name], stream=stream, **options))
    results = await asyncio.gather(*runs)
    return dict(zip(TARGETS, results, strict=True))


def latency_table(
    title: str,
    results: dict[str, LoadResult],
    measure: Callable[[RequestRecord], float | None],
    cpu_us: dict[str, float],
) -> tuple[Grid, dict[str, float]]:
    """Per-target percentiles, added latency vs direct, the paired median difference, and
    the CPU µs each request cost the proxy (``cpu_us``, by target).

    Returns the table and the sluicegate − direct deltas keyed ``p50`` and ``p99`` (ms).
    """
    values = {
        name: {r.index: v for r in res.records if r.ok and (v := measure(r)) is not None}
        for name, res in results.items()
    }
    base = values["direct"]
    headers = cells(
        "target|ok|errors|p50 ms|p90 ms|p99 ms|added p50|added p90|added p99|"
        "paired median|lag p99 ms|proxy CPU µs/req"
    )
    rows, deltas = [], {}
    for name, res in results.items():
        vals = list(values[name].values())
        pcts = [percentile_ms(vals, q) for q in (50, 90, 99)]
        added = [
            p - percentile_ms(list(base.values()), q)
            for p, q in zip(pcts, (50, 90, 99), strict=True)
        ]
        paired = [values[name][i] - base[i] for i in values[name].keys() & base.keys()]
        row = [name, str(len(vals)), str(len(res.records) - len(vals)), *(f"{p:.2f}" for p in pcts)]
        if name == "direct":
            row += ["—"] * 4
        else:
            row += [f"{a:+.2f}" for a in added] + [f"{percentile_ms(paired, 50):+.2f}"]
        lag = f"{res.launch_lag_p99_s * 1000:.2f}"
        rows.append([*row, lag, us(cpu_us.get(name, math.nan))])
        if name == "sluicegate":
            deltas = {"p50": added[0], "p99": added[2]}
    return (title, headers, rows), deltas


async def latencies(
    urls: dict[str, str], args: argparse.Namespace, console: Console
) -> tuple[list[Grid], dict[str, float]]:
    """Warm up, then the non-streaming and streaming latency runs; tables and sluicegate deltas."""
    with console.status("warming up…"):
        await interleaved(urls, latency_schedule(args.warmup, 0), args.rate, stream=False)
    pids = child_pids()
    with console.status(f"latency: {args.requests} requests per target…"):
        before, wall = cpu_seconds(pids), time.monotonic()
        plain = await interleaved(
            urls, latency_schedule(args.requests, args.seed), args.rate, stream=False
        )
        after, wall = cpu_seconds(pids), time.monotonic() - wall
    used = {role: after[role] - before[role] for role in after if role in before}
    plain_us = {name: used[name] / args.requests * 1e6 for name in TARGETS if name in used}
    with console.status(f"streaming: {args.stream_requests} requests per target…"):
        before = cpu_seconds(pids)
        streamed = await interleaved(
            urls, latency_schedule(args.stream_requests, args.seed + 1), args.rate, stream=True
        )
        after = cpu_seconds(pids)
    stream_us = {
        name: (after[name] - before[name]) / args.stream_requests * 1e6
        for name in TARGETS
        if name in after and name in before
    }
    e2e, deltas = latency_table(
        "End-to-end latency, non-streaming", plain, lambda r: r.e2e_s, plain_us
    )
    ttft, _ = latency_table(
        "Time to first token, streaming", streamed, lambda r: r.ttft_s, stream_us
    )
    ours = sum(v for role, v in used.items() if role != "machine")
    deltas["others"] = max(0.0, used.get("machine", ours) - ours) / wall
    return [e2e, ttft], deltas
