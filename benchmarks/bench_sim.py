"""Simulator speed: one hour of the Azure conversation trace, 4 replicas, 5 policies.

Replays ``AzureLLMInferenceTrace_conv.csv`` (19,366 requests over one hour)
through the real scheduler and four emulated Llama-3.1-8B/H100 replicas, once
per policy, the way ``sluicegate simulate`` does (worker processes, about one per
core), and reports the wall time. Bar (issue #32): at most 10 s on a 2-core machine;
before issue #32's fast path it took 25.9–32.5 s (the bar was 60 s, issue #4).

    python benchmarks/bench_sim.py [--write docs/BENCHMARKS.md]
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import platform
import sys
import time
from pathlib import Path

from mdsection import write_section
from sluicegate.sim.comparison import run_comparison
from sluicegate.sim.workload_options import default_config
from sluicegate.sim.workloads import load_workload

ROOT = Path(__file__).resolve().parents[1]
TRACE = ROOT / "data" / "traces" / "AzureLLMInferenceTrace_conv.csv"
POLICIES = ["fifo", "sjf", "slack", "fair", "oracle"]
BAR_S = 10.0
BEFORE = (
    "25.9–32.5 s recorded before issue #32 (decode runs cut at every progress report, "
    "2 workers); that code rerun beside this one on a quiet machine (2026-12-05): 12.2–12.3 s"
)


def main(argv: list[str] | None = None) -> int:
    """Time the replay; print and optionally record the figure."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--replicas", type=int, default=4)
    parser.add_argument("--workers", type=int, default=None)
    parser.add_argument("--out", type=Path, default=Path("sim-out/bench"))
    parser.add_argument("--write", type=Path, default=None)
    args = parser.parse_args(argv)
    requests = load_workload(TRACE)
    start = time.perf_counter()
    result = run_comparison(
        default_config(), requests, POLICIES, out_dir=args.out, replicas=args.replicas,
        workers=args.workers,
    )  # fmt: skip
    elapsed = time.perf_counter() - start
    simulated = sum(s.overall.requests for s in result.summaries)
    verdict = "yes" if elapsed <= BAR_S else "NO"
    lines = [
        "## Simulator: one hour of the Azure conversation trace, 4 replicas, 5 policies",
        "",
        "Command: `python benchmarks/bench_sim.py`  ",
        f"Machine: {platform.machine()}, {os.cpu_count()} cores, "
        f"Python {platform.python_version()}, {sys.platform}  ",
        f"Date: {dt.date.today().isoformat()}",
        "",
        "| requests per policy | policies | replicas | wall time | requests simulated/s "
        f"| at most {BAR_S:g} s |",
        "|---:|---:|---:|---:|---:|---|",
        f"| {len(requests):,} | {len(POLICIES)} | {args.replicas} | {elapsed:.1f} s "
        f"| {simulated / elapsed:,.0f} | {verdict} |",
        "",
        f"Previously: {BEFORE}. Seeded results are byte-identical to those before.",
    ]
    print("\n".join(lines))
    if args.write is not None:
        write_section(args.write, "bench_sim", "\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
