"""Gateway overhead: sluicegate vs a direct call vs a minimal aiohttp pass-through, one run.

One emulated engine (``--preset instant``: 0.2 ms steps, so a request costs about
its HTTP handling) is reached three ways at once: directly, through the
round-robin pass-through (``sluicegate.demo.passthrough``, the floor for a
Python proxy) and through sluicegate (open mode, one model, one backend,
admission caps of 256 so nothing queues, metrics and a 1 s scrape on). All run
as child processes on free loopback ports, stopped at the end.

Latency: request i of every target shares schedule slot i (constant spacing at
``--rate`` per target); inside a slot the three are sent a third of a gap apart
in rotating order, so drift and noise hit all three alike. Each target is driven
by ``run_load`` (one aiohttp session per target). Added latency = percentile of
the proxy − same percentile direct; the paired figure is the median over i of
(proxy_i − direct_i). The streaming run does the same for time to first token.

Throughput: per target, open-loop steps at a doubling rate, then ``--refine``
geometric bisections between the last pass and the first failure; the targets
take turns step by step. A step passes when completions keep pace (≥ 95% of the
offered rate), p99 < ``--p99-limit-ms`` and nothing failed. Each step records the
generator's launch lag and the CPU used by the client, the proxy, the engine and
every other process on the machine: a step failed while others were busy is
retried once, a ceiling set by the generator (launch rate < 95% of offered) is
called out, and the proxy's CPU µs per request gives a second, load-independent
estimate of its one-core ceiling. The generator is a lean aiohttp loop on uvloop
(one pre-encoded body, no parsing): on the 2-core machine it cost ~390 client CPU
µs per request at 1,200/s against ~470 for ``run_load`` on the stdlib loop, CPU the
client otherwise takes from the proxy it measures (``--generator run_load`` to compare).

    python benchmarks/bench_overhead.py [--quick] [--write docs/BENCHMARKS.md]
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import math
import os
import platform
import sys
import tempfile
from pathlib import Path

from rich.console import Console

from livestack import fast_loop
from mdsection import write_section
from overhead_latency import latencies
from overhead_stack import TARGETS, start_targets
from saturation_probe import KEEP_PACE, Probe, Step, cost_us, limiter, saturation, steps_grid
from sluicegate.demo.processes import children
from tables import Grid, bar_row, bars_grid, cells, markdown, pct, render, us

BAR_P50_MS = 1.0
BAR_P99_MS = 5.0
BAR_RATIO = 0.70


def ceiling_grid(steps: dict[str, list[Step]], probes: dict[str, Probe]) -> Grid:
    """Per target: highest passing rate, its ratio to the pass-through's, what limited it, and
    the proxy's CPU cost per request with the one-core ceiling it implies (10⁶ / µs)."""
    base, base_us = probes["pass-through"].lo, cost_us(steps["pass-through"], "pass-through")
    rows = []
    for name in TARGETS:
        ceiling, proxy_us = probes[name].lo, cost_us(steps[name], name)
        ratio = f"{ceiling / base:.0%}" if base > 0 else "—"
        engine_us = cost_us(steps[name], "engine")
        rows.append(
            cells(
                f"{name}|{ceiling:.0f}|{ratio}|{us(engine_us)}|{us(proxy_us)}|"
                f"{us(1e6 / proxy_us)}|{pct(base_us / proxy_us)}|{limiter(steps[name], ceiling)}"
            )
        )
    headers = "target|max sustained req/s|vs pass-through|engine µs/req|proxy µs/req|"
    headers += "proxy 1-core req/s|vs pass-through (CPU)|limited by"
    return "Max sustained throughput", cells(headers), rows


def overhead_bars(
    deltas: dict[str, float], steps: dict[str, list[Step]], probes: dict[str, Probe]
) -> Grid:
    """The DESIGN §13 overhead bars with the margin by which each holds or fails."""
    base = probes["pass-through"].lo
    cpu_ratio = cost_us(steps["pass-through"], "pass-through") / cost_us(
        steps["sluicegate"], "sluicegate"
    )
    throughput = probes["sluicegate"].lo / base * 100 if base > 0 else math.nan
    rows = [
        bar_row("added p50 (sluicegate − direct)", deltas["p50"], BAR_P50_MS, "ms", upper=True),
        bar_row("added p99 (sluicegate − direct)", deltas["p99"], BAR_P99_MS, "ms", upper=True),
        bar_row("throughput vs pass-through", throughput, BAR_RATIO * 100, "%", upper=False),
        bar_row(
            "same, from proxy CPU per request", cpu_ratio * 100, BAR_RATIO * 100, "%", upper=False
        ),
    ]
    return bars_grid(rows, "DESIGN §13 overhead bars")


# ---------------------------------------------------------------------- output


def section(command: str, args: argparse.Namespace, others: float, grids: list[Grid]) -> str:
    """The Markdown section: command, machine, date, setting, then every table."""
    lines = [
        "## Gateway overhead: sluicegate vs direct vs a minimal pass-through",
        "",
        f"Command: `{command}`  ",
        f"Machine: {platform.machine()}, {os.cpu_count()} cores, "
        f"Python {platform.python_version()}, {sys.platform}  ",
        f"Date: {dt.date.today().isoformat()}  ",
        f"Engine: emulator preset `{args.preset}`; client, proxies and engine share the machine. "
        f"Latency: {args.requests} requests per target at {args.rate:g}/s per target, "
        "interleaved; streaming: "
        f"{args.stream_requests} per target. Throughput: {args.step_s:g} s steps, pass = "
        f"achieved ≥ {KEEP_PACE:.0%} of offered, p99 < {args.p99_limit_ms:g} ms, no errors; "
        f"generator `{args.generator}`; a failed step during which other processes kept more "
        f"than {args.noisy_cores:g} cores busy is run once more.  ",
        f"Background load: processes other than ours kept {others:.2f} of "
        f"{os.cpu_count()} cores busy during the latency run (per step: CPU others).",
        "",
    ]
    for grid in grids:
        lines += markdown(grid)
    return "\n".join(lines).rstrip("\n")


def _arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer requests, shorter steps")
    parser.add_argument("--preset", default="instant", help="emulator engine preset")
    parser.add_argument("--rate", type=float, default=50.0, help="latency phase, req/s per target")
    parser.add_argument("--requests", type=int, default=2000, help="latency phase, per target")
    parser.add_argument("--stream-requests", type=int, default=500, help="per target")
    parser.add_argument("--warmup", type=int, default=200, help="per target, discarded")
    parser.add_argument("--start-rate", type=float, default=100.0)
    parser.add_argument("--max-rate", type=float, default=12_800.0)
    parser.add_argument("--step-s", type=float, default=3.0, help="seconds per saturation step")
    parser.add_argument("--refine", type=int, default=3, help="bisections after the ramp")
    parser.add_argument("--pause-s", type=float, default=0.5, help="rest between steps")
    parser.add_argument("--p99-limit-ms", type=float, default=1000.0)
    parser.add_argument("--noisy-cores", type=float, default=0.25, help="retry threshold")
    parser.add_argument("--generator", choices=("lean", "run_load"), default="lean")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--write", type=Path, default=None, help="Markdown file to update")
    args = parser.parse_args(argv)
    if args.quick:
        quick = {"requests": 300, "stream_requests": 100, "warmup": 60, "step_s": 1.5, "refine": 2}
        for name, value in quick.items():
            if getattr(args, name) == parser.get_default(name):
                setattr(args, name, value)
    return args


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark, print the tables and bars, optionally write them into Markdown."""
    args = _arguments(argv)
    console = Console(width=None if sys.stdout.isatty() else 200)
    with tempfile.TemporaryDirectory(prefix="sluicegate-overhead-") as tmp:
        log_dir = Path(tmp)
        with children(log_dir) as group:
            try:
                with console.status("starting the engine, the pass-through and sluicegate…"):
                    urls = start_targets(group, args.preset, log_dir)
            except RuntimeError:
                for log in sorted(log_dir.glob("*.log")):
                    console.print(f"[red]{log.name}[/red]\n{log.read_text()[-2000:]}")
                raise
            # run_load times requests with loop.time(): the stdlib loop's is time.monotonic(),
            # uvloop's ticks in milliseconds. The lean generator keeps its own clock.
            grids, deltas = asyncio.run(latencies(urls, args, console))
            console.print("saturation probe:")
            fast = args.generator == "lean"
            with asyncio.Runner(loop_factory=fast_loop if fast else None) as runner:
                steps, probes = runner.run(saturation(urls, args, console))
    grids += [ceiling_grid(steps, probes), steps_grid(steps)]
    bars = overhead_bars(deltas, steps, probes)
    for grid in [*grids, bars]:
        render(console, grid)
    console.print(f"background load during the latency run: {deltas['others']:.2f} cores")
    for label, value, _, meets, margin in bars[2]:
        if meets == "NO":
            console.print(f"[red]bar not met[/red]: {label} = {value}, {margin}")
    if args.write is not None:
        command = "python benchmarks/bench_overhead.py " + " ".join(
            sys.argv[1:] if argv is None else argv
        )
        write_section(
            args.write,
            "bench_overhead",
            section(command.strip(), args, deltas["others"], [bars, *grids]),
        )
        console.print(f"wrote {args.write}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
