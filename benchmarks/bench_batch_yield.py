"""Yielding: an interactive burst's TTFT with and without a batch saturating the engine.

One emulated engine (preset ``llama-3.1-8b-h100``) behind one gateway, with the
model's default lanes (``interactive`` 32 slots lending, ``batch`` 16,
``best_effort`` 8 borrowing) and ``max_concurrency`` 32, and ``batches:`` on.
Each round runs, side by side (their order alternating between rounds):

(A) an interactive burst alone: Poisson arrivals, streamed chat completions;
(B) the same burst (same seed) while a batch of long lines fills every slot the
    burst does not use (its lines run in ``best_effort`` at priority 5 and
    borrow the idle quota of the other lanes).

It reports the burst's TTFT p50/p99 and end-to-end p99 for both, the ratio B/A
of TTFT p99 (the goal of issue 17: at most 1.2), the batch lines preempted
during the burst, and batch throughput (lines/s) in the seconds before the
burst and during it; per round, the medians of the rounds, and all rounds pooled.

    python benchmarks/bench_batch_yield.py [--rounds 5] [--variants] [--write docs/BENCHMARKS.md]

``--max-inflight N`` and ``--no-borrow`` try a configuration (``batches.max_inflight``;
``best_effort`` on its own 8 slots); ``--variants`` runs both after the one given and
adds a table comparing them.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
from pathlib import Path

from rich.console import Console

from livestack import apply_presets, wide_console, write_report
from tables import Grid, ms, percentile_ms
from yield_rounds import LINE_TOKENS, OUTPUT_CHOICES, PRESET, SLOTS, Phase, batch_slots, measure

MODES: dict[str, dict[str, object]] = {
    "smoke": {
        "rounds": 1,
        "burst_requests": 12,
        "rate": 8.0,
        "settle_s": 0.5,
        "before_s": 1.0,
        "lines": 120,
    },
}


def ttfts(phase: Phase) -> list[float]:
    return [s.ttft_s for s in phase.samples if not math.isnan(s.ttft_s)]


def e2es(phase: Phase) -> list[float]:
    return [s.e2e_s for s in phase.samples if not math.isnan(s.e2e_s)]


def queues(phase: Phase) -> list[float]:
    return [s.queue_s for s in phase.samples if not math.isnan(s.queue_s)]


def failed(phase: Phase) -> int:
    return sum(1 for s in phase.samples if math.isnan(s.e2e_s))


HEADERS = [
    "round (seed)", "A TTFT p50 ms", "A TTFT p99 ms", "A e2e p99 ms", "B TTFT p50 ms",
    "B TTFT p99 ms", "B e2e p99 ms", "B/A TTFT p99", "A queue p99 ms", "B queue p99 ms",
    "lines preempted",
    "batch lines/s before", "batch lines/s during", "failed A/B",
]  # fmt: skip


def figures(a: Phase, b: Phase) -> list[float]:
    """The numbers of one row (or of the pooled samples)."""
    a99, b99 = percentile_ms(ttfts(a), 99), percentile_ms(ttfts(b), 99)
    return [
        percentile_ms(ttfts(a), 50), a99, percentile_ms(e2es(a), 99),
        percentile_ms(ttfts(b), 50), b99, percentile_ms(e2es(b), 99), b99 / a99,
        percentile_ms(queues(a), 99), percentile_ms(queues(b), 99), b.preempted,
        b.lines_per_s_before, b.lines_per_s_during,
    ]  # fmt: skip


def row(label: str, values: list[float], failures: str) -> list[str]:
    """A table row from ``figures``."""
    cells = [ms(v) for v in values[:6]]
    cells += [f"{values[6]:.2f}", ms(values[7]), ms(values[8]), f"{values[9]:.0f}"]
    cells += [f"{values[10]:.2f}", f"{values[11]:.2f}"]
    return [label, *cells, failures]


def table(results: list[tuple[int, Phase, Phase]]) -> tuple[Grid, float]:
    """Per round, their medians, all rounds' requests pooled (preemptions summed, batch
    rates the medians); and the median B/A ratio of TTFT p99."""
    rows, per_round = [], []
    for seed, a, b in results:
        values = figures(a, b)
        per_round.append(values)
        rows.append(row(f"{len(rows) + 1} ({seed})", values, f"{failed(a)}/{failed(b)}"))
    medians = [statistics.median(column) for column in zip(*per_round, strict=True)]
    total = f"{sum(failed(a) for _, a, _ in results)}/{sum(failed(b) for _, _, b in results)}"
    rows.append(row("median of rounds", medians, total))
    pooled_a = Phase([s for _, a, _ in results for s in a.samples])
    pooled_b = Phase(
        [s for _, _, b in results for s in b.samples],
        preempted=sum(b.preempted for _, _, b in results),
        lines_per_s_before=medians[10],
        lines_per_s_during=medians[11],
    )
    rows.append(row("all rounds pooled", figures(pooled_a, pooled_b), total))
    title = "Interactive burst alone (A) and with a saturating batch (B)"
    return (title, HEADERS, rows), medians[6]


def arguments(argv: list[str] | None) -> argparse.Namespace:
    """The command line (``--smoke``: one tiny round, for the test suite)."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="one tiny round")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--burst-requests", type=int, default=80, help="requests per burst")
    parser.add_argument("--rate", type=float, default=12.0, help="burst arrivals per second")
    parser.add_argument("--settle-s", type=float, default=4.0, help="batch alone, unmeasured")
    parser.add_argument("--before-s", type=float, default=6.0, help="batch alone, measured")
    parser.add_argument("--lines", type=int, default=400, help="lines of each round's batch")
    parser.add_argument("--no-borrow", action="store_true", help="best_effort borrow: false")
    parser.add_argument("--max-inflight", type=int, default=None, help="batches.max_inflight")
    parser.add_argument(
        "--yield-hold-s", type=float, default=None, help="batches.yield_hold_s (default 5)"
    )
    parser.add_argument("--variants", action="store_true", help="also run VARIANTS")
    parser.add_argument("--write", type=Path, default=None, help="Markdown file to update")
    args = parser.parse_args(argv)
    return apply_presets(parser, args, [MODES["smoke"]] if args.smoke else [])


VARIANTS: dict[str, dict[str, object]] = {
    "batches.yield_hold_s: 0 (a preempted line's place refilled at once)": {"yield_hold_s": 0.0},
    "batches.max_inflight: 16": {"max_inflight": 16},
    "best_effort borrow: false (8 slots)": {"no_borrow": True},
}
"""What ``--variants`` runs after the configuration the command line gives."""

SUMMARY_HEADERS = [
    "configuration", "A TTFT p99 ms", "B TTFT p99 ms", "B/A TTFT p99 (pooled)",
    "B/A TTFT p99 (median of rounds)", "B/A TTFT p50", "B/A e2e p99",
    "lines preempted per interactive request", "batch lines/s before", "batch lines/s during",
]  # fmt: skip


def summary_row(label: str, results: list[tuple[int, Phase, Phase]], ratio: float) -> list[str]:
    """One configuration's pooled figures."""
    a = Phase([s for _, one, _ in results for s in one.samples])
    b = Phase([s for _, _, one in results for s in one.samples])
    values = figures(a, b)
    preempted = sum(one.preempted for _, _, one in results) / max(1, len(b.samples))
    before = statistics.median(one.lines_per_s_before for _, _, one in results)
    during = statistics.median(one.lines_per_s_during for _, _, one in results)
    return [
        label, ms(values[1]), ms(values[4]), f"{values[6]:.2f}", f"{ratio:.2f}",
        f"{values[3] / values[0]:.2f}", f"{values[5] / values[2]:.2f}", f"{preempted:.2f}",
        f"{before:.2f}", f"{during:.2f}",
    ]  # fmt: skip


def describe(args: argparse.Namespace) -> str:
    """The gateway configuration of a run, in words."""
    lanes = "the default lanes" + (" but `best_effort` `borrow: false`" if args.no_borrow else "")
    window = "unset (the model's 32)" if args.max_inflight is None else str(args.max_inflight)
    hold = "5 (default)" if args.yield_hold_s is None else f"{args.yield_hold_s:g}"
    return (
        f"model `max_concurrency` {SLOTS}, {lanes}, `batches.max_inflight` {window},"
        f" `batches.yield_hold_s` {hold}"
    )


def main(argv: list[str] | None = None) -> int:
    """Run the rounds (and ``--variants``), print the tables, optionally write the section."""
    args = arguments(argv)
    out: Console = wide_console()
    results, others = measure(args, out)
    grid, ratio = table(results)
    grids = [grid]
    if args.variants:
        rows = [summary_row("as above", results, ratio)]
        for label, changes in VARIANTS.items():
            variant = argparse.Namespace(**{**vars(args), **changes})
            found, busy = measure(variant, out)
            others = max(others, busy)
            rows.append(summary_row(label, found, table(found)[1]))
        grids.append(("The same rounds under other configurations", SUMMARY_HEADERS, rows))
    a = [s for _, one, _ in results for s in one.samples]
    b = [s for _, _, one in results for s in one.samples]
    queue_p99 = percentile_ms([s.queue_s for s in b if not math.isnan(s.queue_s)], 99)
    preempted = sum(one.preempted for _, _, one in results) / max(1, len(b))
    verdict = "meets" if ratio <= 1.2 else "MISSES"
    notes = [
        f"Engine: one emulator, preset `{PRESET}`. Gateway: {describe(args)}. Burst: "
        f"{args.burst_requests} streamed chat completions at {args.rate:g}/s (Poisson), "
        f"prompts of 100–800 words, {'/'.join(map(str, OUTPUT_CHOICES))} tokens out. Batch: "
        f"{args.lines} lines of {LINE_TOKENS[0]}–{LINE_TOKENS[1]} tokens out, filling "
        f"{batch_slots(args)} slots for {args.settle_s:g} + {args.before_s:g} s (the second "
        "part measured) before the burst; cancelled after it. Queue: the gateway's "
        "`X-Sluicegate-Queue-Ms` (arrival to admission; in (B) it includes the preemption). "
        f"{len(a)} requests in (A), {len(b)} in (B).",
        f"Median B/A of interactive TTFT p99: {ratio:.2f} ({verdict} the 1.2 goal). In (B) "
        f"{preempted:.2f} batch lines were preempted per interactive request and the "
        f"interactive queue wait p99 was {queue_p99:.1f} ms: the preemption itself is quick; "
        "the rest of the gap is spent in the engine, whose steps also carry the batch's "
        "decodes and the prefills of the lines that refill every slot an interactive request "
        f"gives back. Processes not ours kept up to {others:.2f} of {os.cpu_count()} cores "
        "busy.",
    ]
    write_report(
        args, script="bench_batch_yield.py", section="bench_batch_yield",
        title="Batch yielding: interactive TTFT with a saturating batch", notes=notes,
        grids=grids, argv=argv, out=out,
    )  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
