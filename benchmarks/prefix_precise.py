"""Precise prefix routing (issue 31): `random`, `least_inflight`, `prefix_affinity` (the
ring) and `precise_prefix` without and with stickiness, on three prefix workloads.

Replays each workload through the real scheduler and N Llama-3.1-8B/H100 engine models
with LRU prefix caches whose KV events feed the router's index (``sim/replica_kv_events.py``),
once per router, per load, and per KV event delay for the routers that read events
(``prefix_precise_runs.py`` holds the workloads and one run). Prints (or writes into
docs/POLICIES.md) TTFT p50/p90/p99, output tokens/s, prefix-cache hit rate (tokens),
load imbalance (max ÷ mean requests per replica) and the goals of the issue:

- at the highest B2B load that sticky precise routing sustains (nothing refused, TTFT
  p90 ≤ 1 s), its TTFT p90 ≤ 1/10 of the ring's and its throughput ≥ 1.2× the ring's;
- at every B2B load, sticky precise routing no worse than `least_inflight`: TTFT p90 no
  higher and throughput at least 98% of it (2%: the drain of a run's last requests).

    python benchmarks/prefix_precise.py [--rates 10,30,50,60,70,80,100] [--write docs/POLICIES.md]
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from mdsection import write_section
from prefix_precise_runs import SUSTAIN_P90_S, Job, Metrics, Setup, run, synthetic_trace
from tables import bar_row

DEFAULT_PENALTY_MS = 200.0
"""The sticky router's ``max_ttft_penalty_ms``: about one cold B2B context's prefill at the
preset's rate (6,128 tokens ÷ 40,000 tokens/s ≈ 153 ms) plus a question's. Following a
prefix pays while the wait it adds is below what a miss elsewhere would cost, which is
that prefill; so at most about one cold context may be queued ahead. Measured at 75
req/s: 100 and 150 ms spill too early (p90 22 s), 200–300 ms sustain (p90 0.19 s), 500,
1000 and 2000 ms hot-spot (p90 4.7, 7.2, 8.8 s)."""
LIVE_PENALTY_MS = 500.0
"""The live sticky router's ``max_ttft_penalty_ms``: about one cold 1,536-token context's
prefill on the ten-fold slowed preset (384 ms) plus a question's."""
SECTION = "prefix_precise"
LIVE_SECTION = "prefix_precise_live"


def setups(penalty_ms: float) -> list[Setup]:
    """The compared routers; ``penalty_ms`` is the sticky one's ``max_ttft_penalty_ms``."""
    return [
        Setup("`random`", "random"),
        Setup("`least_inflight`", "least_inflight"),
        Setup("`prefix_affinity` (ring)", "prefix_affinity"),
        Setup("`precise_prefix`, not sticky", "precise_prefix"),
        Setup(f"`precise_prefix`, sticky {penalty_ms:g} ms", "precise_prefix", penalty_ms),
    ]


def jobs(
    workload: str, rates: Sequence[float], delays: Sequence[float], replicas: int,
    args: argparse.Namespace, trace: str = "",
) -> list[Job]:  # fmt: skip
    """Every (rate, set-up, delay) run of one workload; routers that read no events run
    once (the delay cannot change them)."""
    out = []
    for rate in rates:
        for setup in setups(args.penalty):
            for delay in delays if setup.reads_events else delays[:1]:
                out.append(
                    Job(workload, rate, setup, delay if setup.reads_events else 0.0, replicas,
                        args.duration, args.seed, args.ttl, trace)
                )  # fmt: skip
    return out


def _s(value: float) -> str:
    return "—" if math.isnan(value) else f"{value:.2f}"


def table(results: Sequence[Metrics]) -> list[str]:
    """The Markdown rows of one workload's runs."""
    head = [
        "offered (req/s)", "router", "event delay (s)", "TTFT p50 (s)", "TTFT p90 (s)",
        "TTFT p99 (s)", "output tok/s", "hit rate (tokens)", "imbalance", "completed",
    ]  # fmt: skip
    lines = ["| " + " | ".join(head) + " |", "|" + "---:|" * 1 + "---|" + "---:|" * 8]
    for m in results:
        j = m.job
        delay = f"{j.delay_s:g}" if j.setup.reads_events else "—"
        lines.append(
            f"| {m.offered / j.duration_s:.1f} | {j.setup.label} | {delay} | {_s(m.p50_s)} "
            f"| {_s(m.p90_s)} | {_s(m.p99_s)} | {m.output_tok_s:,.0f} | {m.hit_rate:.1%} "
            f"| {m.imbalance:.2f} | {m.completed}/{m.offered} |"
        )
    return lines


def _find(results: Sequence[Metrics], rate: float, router: str, penalty: float | None,
          delay: float) -> Metrics:  # fmt: skip
    for m in results:
        j = m.job
        if (j.rate, j.setup.router, j.setup.penalty_ms) == (rate, router, penalty) and (
            j.delay_s == delay or not j.setup.reads_events
        ):
            return m
    raise KeyError((rate, router, penalty, delay))


def goals(results: Sequence[Metrics], rates: Sequence[float], delays: Sequence[float],
          penalty: float) -> list[list[str]]:  # fmt: skip
    """The goal rows (``tables.bar_row``), per event delay."""
    rows = []
    for delay in delays:
        sticky = {r: _find(results, r, "precise_prefix", penalty, delay) for r in rates}
        held = [r for r in rates if sticky[r].sustained]
        tag = f"event delay {delay:g} s"
        if not held:
            rows.append([f"B2B, {tag}: a load sticky precise sustains", "none", "", "NO", ""])
        else:
            top = max(held)
            ring = _find(results, top, "prefix_affinity", None, delay)
            rows.append(bar_row(
                f"B2B {top:g} req/s ({tag}): TTFT p90 precise ÷ ring",
                sticky[top].p90_s / ring.p90_s, 0.1, "", upper=True, digits=3,
            ))  # fmt: skip
            rows.append(bar_row(
                f"B2B {top:g} req/s ({tag}): output tok/s precise ÷ ring",
                sticky[top].output_tok_s / ring.output_tok_s, 1.2, "", upper=False,
            ))  # fmt: skip
        for label, pen in (("sticky", penalty), ("not sticky", None)):
            worst_p90 = max(
                _find(results, r, "precise_prefix", pen, delay).p90_s
                / _find(results, r, "least_inflight", None, delay).p90_s
                for r in rates
            )
            worst_tok = min(
                _find(results, r, "precise_prefix", pen, delay).output_tok_s
                / _find(results, r, "least_inflight", None, delay).output_tok_s
                for r in rates
            )
            rows.append(bar_row(
                f"B2B every load ({tag}), {label}: worst TTFT p90 precise ÷ least_inflight",
                worst_p90, 1.0, "", upper=True, digits=3,
            ))  # fmt: skip
            rows.append(bar_row(
                f"B2B every load ({tag}), {label}: worst tok/s precise ÷ least_inflight",
                worst_tok, 0.98, "", upper=False, digits=3,
            ))  # fmt: skip
    return rows


def main_live(args: argparse.Namespace) -> int:
    """The live comparison (``prefix_precise_live.py``): print the table, or write it."""
    from prefix_precise_live import run_live

    table, notes = run_live(args)
    command = (
        f"python benchmarks/prefix_precise.py --live --live-rates {args.live_rates} "
        f"--live-duration {args.live_duration:g} --live-penalty {args.live_penalty:g} "
        f"--seed {args.seed}"
    )
    text = "\n".join([f"`{command}`", "", *table, "", *notes])
    print(text)
    if args.write is not None:
        write_section(args.write, LIVE_SECTION, text)
    return 0


def _floats(text: str) -> list[float]:
    return [float(x) for x in text.split(",") if x]


def main(argv: list[str] | None = None) -> int:
    """Run every workload, print the tables and goals (or write them)."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--rates", default="10,30,50,60,70,75,80,100", help="B2B req/s")
    parser.add_argument("--replicas", type=int, default=8)
    parser.add_argument("--shared-rates", default="24,45", help="shared-prompt req/s, 4 replicas")
    parser.add_argument("--trace-rates", default="20,40,60", help="trace req/s, 8 replicas")
    parser.add_argument("--delays", default="0,0.05", help="KV event delays (s)")
    parser.add_argument("--penalty", type=float, default=DEFAULT_PENALTY_MS, help="sticky ms")
    parser.add_argument("--ttl", type=float, default=2.0, help="recent_ttl_s")
    parser.add_argument("--duration", type=float, default=60.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--out", type=Path, default=Path("sim-out/prefix_precise"))
    parser.add_argument("--write", type=Path, default=None)
    parser.add_argument("--live", action="store_true", help="the live B2B comparison instead")
    parser.add_argument("--live-rates", default="4,7,10", help="live B2B req/s")
    parser.add_argument("--live-duration", type=float, default=15.0, help="live seconds per run")
    parser.add_argument("--live-penalty", type=float, default=LIVE_PENALTY_MS, help="sticky ms")
    args = parser.parse_args(argv)
    if args.live:
        return main_live(args)
    rates, delays = _floats(args.rates), _floats(args.delays)
    shared_rates, trace_rates = _floats(args.shared_rates), _floats(args.trace_rates)
    traces = {
        rate: str(synthetic_trace(args.out / f"trace-{rate:g}.jsonl", rate, args.duration,
                                  seed=args.seed))
        for rate in trace_rates
    }  # fmt: skip
    work = {
        "b2b": jobs("b2b", rates, delays, args.replicas, args),
        "shared": jobs("shared", shared_rates, delays, 4, args),
        "trace": [j for r in trace_rates for j in jobs("trace", [r], delays, 8, args, traces[r])],
    }
    with ProcessPoolExecutor(max_workers=args.workers) as pool:
        done = {name: list(pool.map(run, batch)) for name, batch in work.items()}
    command = (
        f"python benchmarks/prefix_precise.py --rates {args.rates} --replicas {args.replicas} "
        f"--shared-rates {args.shared_rates} --trace-rates {args.trace_rates} "
        f"--delays {args.delays} --penalty {args.penalty:g} --ttl {args.ttl:g} "
        f"--duration {args.duration:g} --seed {args.seed}"
    )
    goal_rows = goals(done["b2b"], rates, delays, args.penalty)
    body = [
        f"`{command}`",
        "",
        f"**(a) B2B, {args.replicas} replicas** (150 customers, 6,000-token contexts, "
        "Zipf 1.1, Poisson):",
        "",
        *table(done["b2b"]),
        "",
        "**(b) Shared system prompts, 4 replicas** (512 prompts of 2,048 tokens, Zipf 0.8):",
        "",
        *table(done["shared"]),
        "",
        "**(c) Synthetic Mooncake-style trace, 8 replicas** (`hash_ids` of 512-token blocks, "
        "`--field prefix=hash_ids:512`):",
        "",
        *table(done["trace"]),
        "",
        f"**Goals** (sustained: all completed, TTFT p90 ≤ {SUSTAIN_P90_S:g} s):",
        "",
        "| goal | measured | limit | meets | margin |",
        "|---|---:|---|---|---|",
        *("| " + " | ".join(row) + " |" for row in goal_rows),
    ]
    text = "\n".join(body)
    print(text)
    if args.write is not None:
        write_section(args.write, SECTION, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
