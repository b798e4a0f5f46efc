"""Overload: offered load stepped 0.5× → 3× → 0.5× of capacity through one gateway.

One emulated engine of eight independent servers (preset ``independent`` with
``--max-num-seqs 8``: every request takes exactly its solo service time, so
capacity is known, not guessed) sits behind sluicegate, whose one
``interactive`` lane runs 8 at a time, queues at most ``MAX_QUEUE``, expires a
wait past ``QUEUE_TIMEOUT_S`` and has an end-to-end SLO of ``SLO_MS``. Requests
are identical streams (16-token prompt, 32 tokens out): capacity = 8 /
``solo_service_s(16, 32)`` = 24.99 req/s. Poisson arrivals (seeded) step from
0.5× to 3× and back to 0.5× of it, after a discarded warm-up at 0.5×.

Per step: offered and admitted (the step's arrivals answered 200) per second,
429 and 503 rates, how fast a 429 came back (p50, p99) next to the p99 of a
``GET /healthz`` probe every 50 ms through the same client (the floor that
process scheduling on the shared machine puts under any answer), admitted TTFT
and end-to-end p99 against the SLO, goodput (completions within the SLO that
ended in the step, per second) against capacity, the gateway's CPU and its
resident memory. Recovery: the first 1 s window of arrivals after the step
down whose end-to-end p99 is within ``--recovery-factor`` × the baseline p99,
measured from the step down, against two queue timeouts. Memory is flat when
its maximum after the baseline stays within ``--rss-growth`` of its value at
the baseline's end.

    python benchmarks/bench_overload.py [--full | --smoke] [--write docs/BENCHMARKS.md]
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import random
from dataclasses import dataclass, replace
from pathlib import Path

import aiohttp
from rich.console import Console

from livestack import (
    CpuMeter,
    Process,
    live_stack,
    wide_console,
    write_report,
)
from sluicegate.bench.loadgen import run_load
from sluicegate.bench.records import RequestRecord
from sluicegate.engine.presets import preset
from sluicegate.outcomes import WorkloadRequest
from tables import Grid, bar_row, bars_grid, cells, ms, percentile_ms

MODEL = "overload-llm"
SLOTS = 8
PROMPT_TOKENS = 16
OUTPUT_TOKENS = 32
MAX_QUEUE = 16
QUEUE_TIMEOUT_S = 1.0
SLO_MS = 1500.0
PRESET = "independent"
ENGINE = replace(preset(PRESET), max_num_seqs=SLOTS)
CAPACITY_RPS = SLOTS / ENGINE.solo_service_s(PROMPT_TOKENS, OUTPUT_TOKENS)
BAR_REJECT_P99_MS = 5.0
BAR_GOODPUT = 0.90


def gateway_config(engine_url: str) -> str:
    """One model, one backend, one ``interactive`` lane sized to the engine."""
    return f"""\
models:
  - name: {MODEL}
    backends: [{{name: e0, url: "{engine_url}", engine: emulator}}]
    max_concurrency: {SLOTS}
    prior_output_tokens: {OUTPUT_TOKENS}
    prior_decode_tokens_per_s: 100
    lanes:
      - {{name: interactive, max_concurrency: {SLOTS}, max_queue: {MAX_QUEUE},
          queue_timeout_s: {QUEUE_TIMEOUT_S:g}, slo_ms: {SLO_MS:g}, policy: slack,
          preemptible: never}}
"""


MODES = {
    "smoke": {"warmup_s": 1.0, "base_s": 2.0, "peak_s": 3.0, "after_s": 3.0},
    "quick": {"warmup_s": 3.0, "base_s": 12.0, "peak_s": 20.0, "after_s": 15.0},
    "full": {"warmup_s": 5.0, "base_s": 30.0, "peak_s": 120.0, "after_s": 60.0},
}


@dataclass(frozen=True, slots=True)
class Phase:
    """One step of the offered load: ``multiple`` × capacity over ``[start_s, end_s)``."""

    name: str
    multiple: float
    start_s: float
    end_s: float

    @property
    def duration_s(self) -> float:
        """Length of the step."""
        return self.end_s - self.start_s


Sample = tuple[float, int, float]
"""(seconds from the run's start, gateway RSS bytes, gateway CPU seconds so far)."""


def phases(args: argparse.Namespace) -> list[Phase]:
    """Warm-up, baseline, peak and step-down, back to back."""
    spans = [
        ("warm-up", 0.5, args.warmup_s),
        ("0.5× (baseline)", 0.5, args.base_s),
        (f"{args.peak:g}× (overload)", args.peak, args.peak_s),
        ("0.5× (after)", 0.5, args.after_s),
    ]
    result, start = [], 0.0
    for name, multiple, length in spans:
        result.append(Phase(name, multiple, start, start + length))
        start += length
    return result


def schedule(steps: list[Phase], seed: int) -> list[WorkloadRequest]:
    """Poisson arrivals at each step's rate; identical requests."""
    rng = random.Random(seed)
    requests = []
    for step in steps:
        rate = step.multiple * CAPACITY_RPS
        at = step.start_s + rng.expovariate(rate)
        while at < step.end_s:
            requests.append(WorkloadRequest(at, PROMPT_TOKENS, OUTPUT_TOKENS, OUTPUT_TOKENS))
            at += rng.expovariate(rate)
    return requests


async def watch(gateway: Process, samples: list[Sample], every_s: float) -> None:
    """Sample the gateway's RSS and CPU every ``every_s`` until cancelled."""
    loop = asyncio.get_running_loop()
    start = loop.time()
    while True:
        samples.append((loop.time() - start, gateway.rss_bytes(), gateway.cpu_s()))
        await asyncio.sleep(every_s)


async def probe(url: str, probes: list[tuple[float, float]], every_s: float) -> None:
    """``GET /healthz`` every ``every_s`` until cancelled: (seconds from start, latency).

    The cheapest answer the gateway gives, through the same client loop: the floor
    that process scheduling on the shared machine puts under any latency, a 429's too.
    """
    loop = asyncio.get_running_loop()
    start = loop.time()
    async with aiohttp.ClientSession() as session:
        while True:
            sent = loop.time()
            async with session.get(url + "/healthz") as response:
                await response.read()
            probes.append((sent - start, loop.time() - sent))
            await asyncio.sleep(max(0.0, every_s - (loop.time() - sent)))


@dataclass(frozen=True, slots=True)
class Run:
    """What one replay measured.

    Attributes:
        records: one per scheduled request.
        samples: the gateway's RSS and CPU over time.
        probes: (seconds from start, latency) of each ``/healthz`` probe.
        others_cores: cores kept busy by processes not ours, on average.
    """

    records: list[RequestRecord]
    samples: list[Sample]
    probes: list[tuple[float, float]]
    others_cores: float


async def drive(
    url: str, gateway: Process, engine: Process, requests: list[WorkloadRequest]
) -> Run:
    """Replay the schedule while sampling the gateway and probing its floor latency."""
    samples: list[Sample] = []
    probes: list[tuple[float, float]] = []
    meter = CpuMeter([gateway, engine])
    tasks = [
        asyncio.create_task(watch(gateway, samples, 0.25)),
        asyncio.create_task(probe(url, probes, 0.05)),
    ]
    try:
        result = await run_load(requests, base_url=url, model=MODEL, api_keys={}, timeout_s=30.0)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    samples.append((result.duration_s, gateway.rss_bytes(), gateway.cpu_s()))
    return Run(list(result.records), samples, probes, meter.others_cores())


# ------------------------------------------------------------------ analysis


def within(records: list[RequestRecord], step: Phase) -> list[RequestRecord]:
    """Requests scheduled during ``step``."""
    return [r for r in records if step.start_s <= r.scheduled_s < step.end_s]


def good(record: RequestRecord) -> bool:
    """Succeeded within the lane's SLO, as every summary counts it (``sluicegate.outcomes``)."""
    return record.as_outcome(SLO_MS).good


def step_row(run: Run, step: Phase) -> list[str]:
    """The figures of one step."""
    mine = within(run.records, step)
    span = step.duration_s
    ok = [r for r in mine if r.ok]
    rejected = [r.e2e_s for r in mine if r.status == 429]
    expired = sum(1 for r in mine if r.status == 503)
    other = len(mine) - len(ok) - len(rejected) - expired
    ended = sum(1 for r in run.records if good(r) and step.start_s <= r.finished_s < step.end_s)
    inside = [s for s in run.samples if step.start_s <= s[0] <= step.end_s]
    rss = max((s[1] for s in inside), default=0) / 2**20
    cpu = (inside[-1][2] - inside[0][2]) / (inside[-1][0] - inside[0][0]) if len(inside) > 1 else 0
    floor = [latency for at, latency in run.probes if step.start_s <= at < step.end_s]
    lag = percentile_ms([r.launch_lag_s for r in mine], 99)
    return cells(
        f"{step.name}|{len(mine) / span:.1f}|{len(ok) / span:.1f}|{len(rejected) / span:.1f}|"
        f"{ms(percentile_ms(rejected, 50), 2)}|{ms(percentile_ms(rejected, 99), 2)}|"
        f"{ms(percentile_ms(floor, 99), 2)}|{expired}|{other}|"
        f"{ms(percentile_ms([r.ttft_s for r in ok if r.ttft_s is not None], 99))}|"
        f"{ms(percentile_ms([r.e2e_s for r in ok], 99))}|"
        f"{ended / span:.1f}|{ended / span / CAPACITY_RPS:.0%}|{cpu:.0%}|{rss:.1f}|{ms(lag)}"
    )


STEP_HEADERS = cells(
    "step|offered/s|admitted/s|429/s|429 p50 ms|429 p99 ms|/healthz p99 ms|503|other errors|"
    "TTFT p99 ms|e2e p99 ms|goodput/s|goodput vs capacity|gateway CPU|gateway RSS MiB (max)|"
    "launch lag p99 ms"
)


def recovery_s(
    records: list[RequestRecord], after: Phase, bound_s: float, window_s: float
) -> float:
    """Seconds from the step down to the first ``window_s`` window of arrivals whose
    end-to-end p99 is within ``bound_s``; NaN if none is."""
    t = after.start_s
    while t + window_s <= after.end_s:
        e2e = [
            r.e2e_s if r.ok else math.inf
            for r in records
            if t <= r.scheduled_s < t + window_s and r.status != 429
        ]
        if e2e and percentile_ms(e2e, 99) / 1000.0 <= bound_s:
            return t - after.start_s
        t += 0.1
    return math.nan


@dataclass(frozen=True, slots=True)
class Verdicts:
    """The measured values the bars judge."""

    peak_p99_ms: float
    reject_p99_ms: float
    goodput_share: float
    recovery_s: float
    rss_growth: float
    baseline_p99_ms: float


def verdicts(run: Run, steps: list[Phase], args: argparse.Namespace) -> Verdicts:
    """Measure what the bars judge."""
    records, samples = run.records, run.samples
    _, base, peak, after = steps
    base_ok = [r.e2e_s for r in within(records, base) if r.ok]
    peak_records = within(records, peak)
    baseline_p99 = percentile_ms(base_ok, 99)
    ended = sum(1 for r in records if good(r) and peak.start_s <= r.finished_s < peak.end_s)
    base_rss = [s[1] for s in samples if base.start_s <= s[0] <= base.end_s]
    later_rss = [s[1] for s in samples if s[0] > base.end_s]
    growth = (
        max(later_rss) / base_rss[-1] - 1.0 if base_rss and later_rss and base_rss[-1] else math.nan
    )
    return Verdicts(
        peak_p99_ms=percentile_ms([r.e2e_s for r in peak_records if r.ok], 99),
        reject_p99_ms=percentile_ms([r.e2e_s for r in peak_records if r.status == 429], 99),
        goodput_share=ended / peak.duration_s / CAPACITY_RPS,
        recovery_s=recovery_s(records, after, baseline_p99 / 1000.0 * args.recovery_factor, 1.0),
        rss_growth=growth,
        baseline_p99_ms=baseline_p99,
    )


def bars(v: Verdicts, args: argparse.Namespace) -> Grid:
    """Each bar of the issue with its margin."""
    peak = f"{args.peak:g}×"
    rows = [
        bar_row(f"admitted e2e p99 at {peak}", v.peak_p99_ms, SLO_MS, "ms", upper=True),
        bar_row(f"429 latency p99 at {peak}", v.reject_p99_ms, BAR_REJECT_P99_MS, "ms", upper=True),
        bar_row(
            f"goodput at {peak} vs capacity", v.goodput_share * 100, BAR_GOODPUT * 100, "%",
            upper=False,
        ),
        bar_row(
            f"recovery to {args.recovery_factor:g}× baseline p99 ({v.baseline_p99_ms:.0f} ms)",
            v.recovery_s, 2 * QUEUE_TIMEOUT_S, "s", upper=True,
        ),
        bar_row(
            "gateway RSS growth after the baseline", v.rss_growth * 100, args.rss_growth * 100,
            "%", upper=True,
        ),
    ]  # fmt: skip
    return bars_grid(rows, "Overload bars (issue: overload)")


# ---------------------------------------------------------------------- main


def arguments(argv: list[str] | None) -> argparse.Namespace:
    """Parse the command line; ``--full``/``--smoke`` pick the step lengths (default: quick)."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--full", action="store_true", help="long steps (about 4 minutes)")
    mode.add_argument("--smoke", action="store_true", help="tiny steps, for the test suite")
    for name in MODES["quick"]:
        parser.add_argument(f"--{name.replace('_', '-')}", type=float, default=None)
    parser.add_argument("--peak", type=float, default=3.0, help="overload, × capacity")
    parser.add_argument("--recovery-factor", type=float, default=1.25)
    parser.add_argument("--rss-growth", type=float, default=0.10, help="flat = growth under this")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--write", type=Path, default=None, help="Markdown file to update")
    args = parser.parse_args(argv)
    chosen = MODES["full" if args.full else "smoke" if args.smoke else "quick"]
    for name, value in chosen.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    args.mode = "full" if args.full else "smoke" if args.smoke else "quick"
    return args


def replay(args: argparse.Namespace, out: Console) -> Run:
    """Start the engine and the gateway, replay the steps, stop them."""
    steps = phases(args)
    requests = schedule(steps, args.seed)
    with live_stack(out, "sluicegate-overload-") as stack:
        with out.status("starting the engine and sluicegate…"):
            engine = stack.engine(MODEL, PRESET, max_num_seqs=SLOTS)
            gateway = stack.gateway(gateway_config(engine.url))
        with out.status(f"{len(requests)} requests over {steps[-1].end_s:.0f} s…"):
            return asyncio.run(drive(gateway.url, gateway, engine, requests))


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark, print the tables and bars, optionally write the section."""
    args = arguments(argv)
    out = wide_console()
    steps = phases(args)
    run = replay(args, out)
    table: Grid = ("Per step", STEP_HEADERS, [step_row(run, s) for s in steps[1:]])
    measured = verdicts(run, steps, args)
    notes = [
        f"Mode: {args.mode}. Engine: emulator preset `{PRESET}` with {SLOTS} servers "
        f"({PROMPT_TOKENS}-token prompts, {OUTPUT_TOKENS} tokens out, streamed: "
        f"{ENGINE.solo_service_s(PROMPT_TOKENS, OUTPUT_TOKENS) * 1000:.1f} ms each), so capacity "
        f"= {CAPACITY_RPS:.2f} req/s (derived from the engine model).",
        f"Gateway lane `interactive`: {SLOTS} slots, max_queue {MAX_QUEUE}, queue_timeout "
        f"{QUEUE_TIMEOUT_S:g} s, SLO {SLO_MS:g} ms end to end, policy `slack`. Poisson arrivals "
        f"(seed {args.seed}): warm-up {args.warmup_s:g} s at 0.5× (not reported), then "
        f"{args.base_s:g} s at 0.5×, {args.peak_s:g} s at {args.peak:g}×, {args.after_s:g} s "
        "at 0.5×. Generator, gateway and engine share the machine: /healthz p99 is the "
        "latency of the gateway's cheapest answer through the same client, probed every "
        f"50 ms, the floor under a 429's. Background: processes not ours kept "
        f"{run.others_cores:.2f} of {os.cpu_count()} cores busy.",
    ]
    write_report(
        args, script="bench_overload.py", section="bench_overload",
        title="Overload: 0.5× → 3× → 0.5× of capacity", notes=notes,
        grids=[bars(measured, args), table], argv=argv, out=out,
    )  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
