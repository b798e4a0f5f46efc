"""Per-request cost at the Python floor (issue 18): sluicegate vs the aiohttp pass-through.

Two upstreams, one after the other: a tiny aiohttp server with fixed answers
(``fake_upstream.py``, on uvloop: the proxy's cost dominates) and the emulator
(``emulate --preset instant``: realistic streams). In front of each, as child
processes on free loopback ports: nothing (``direct``), the aiohttp pass-through
(``sluicegate.demo.passthrough``, the Python floor) and sluicegate (``serve``: one
model, one slack lane, one keyed tenant, admission and metrics on, caps that never
bind; ``--gateway-arg`` adds ``serve`` arguments, ``--label`` names it), one per
lane set-up ``--config`` names (default: ``never`` and ``default``, the lane with
``preemptible`` unset, side by side), plus one more sluicegate per ``--variant
NAME=ARGS``, started with those extra arguments (and the first set-up).

Fixed rates: every target is offered the same open-loop rate, all at once (100 and
300 req/s non-streaming, then streaming at 100 req/s): request i of the K targets
are launched 1/K of a gap apart, in an order that rotates with i, by one lean
generator (uvloop, one pre-encoded body, nothing parsed). Each phase records the
CPU every process used (/proc ticks, a process with its descendants: a gateway's
workers) and runs ``--repeats`` times; the tables give medians over the repeats.
Added latency = a percentile through the proxy − the same percentile direct;
paired = median over i of (proxy_i − direct_i). Time to first token = until the
first body chunk holding an SSE ``data:`` line.

Saturation: ``saturation_probe.saturation`` (open-loop steps at doubling rates, then
geometric bisection; targets take turns). CPU per request at the maximum is that of
the step at the highest passing rate. Memory: ``VmRSS`` at the end and the peak
``VmHWM``, summed over a proxy's processes.

    python benchmarks/bench_floor.py [--quick] [--repeats 3] [--config never --config default]
        [--variant "x2=--workers 2"]
        [--write docs/BENCHMARKS.md]
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from floor_measure import HIGH, HIGH_RATE, LOW, LOW_RATE, STREAM, Measured, measure
from floor_stack import DIRECT, ENGINE, FLOOR, LANE_SETUPS, gateway_args, stack
from livestack import apply_presets, fast_loop, wide_console, write_report
from saturation_probe import limiter, steps_grid
from tables import Grid, bar_row, bars_grid, cells

UPSTREAMS = {"fake": "tiny aiohttp upstream", "emulator": "emulator"}
CPU_RATIO, CPU_RATIO_LOW_RATE = 1.0, 1.2
ADDED_P50_MS, ADDED_P99_MS = 0.5, 2.0
FLOOR_CPU, FLOOR_RATE, FLOOR_P99_MS, STRETCH_CPU = 1.05, 0.95, 2.0, 0.75
"""Issue 33's bars: CPU per request at saturation and max throughput as ratios to the
pass-through, added p99 at 300 req/s within the pass-through's own + 2 ms; the stretch."""


def _x(value: float, base: float) -> str:
    """``value / base`` as a ratio; ``—`` when either is unknown or ``base`` is not positive."""
    return "—" if math.isnan(value) or not base > 0 else f"{value / base:.2f}×"


def _num(value: float, digits: int = 0, sign: bool = False) -> str:
    return "—" if math.isnan(value) else f"{value:{'+' if sign else ''},.{digits}f}"


def summary_grid(m: Measured) -> Grid:
    """The issue's table for one upstream: each figure, and its ratio to the pass-through's."""
    columns: list[tuple[str, Callable[[str], float], int, bool]] = [
        ("max req/s", lambda t: m.at_max(t)[0], 0, False),
        ("CPU µs/req at max", lambda t: m.at_max(t)[1], 0, False),
        ("CPU µs/req @300/s", lambda t: m.median(HIGH, t, "cpu us"), 0, False),
        ("CPU µs/req @100/s", lambda t: m.median(LOW, t, "cpu us"), 0, False),
        ("added p50 @100/s ms", lambda t: m.median(LOW, t, "added p50"), 2, True),
        ("added p99 @300/s ms", lambda t: m.median(HIGH, t, "added p99"), 2, True),
        ("TTFT added p50 ms", lambda t: m.median(STREAM, t, "added p50"), 2, True),
        ("TTFT added p99 ms", lambda t: m.median(STREAM, t, "added p99"), 2, True),
        ("RSS MB", lambda t: m.memory_mb.get(t, (math.nan, 0.0))[0], 0, False),
    ]
    rows = []
    for target in m.stack.urls:
        row = [target]
        for header, get, digits, sign in columns:
            value = get(target)
            if target == DIRECT and "added" in header:
                row.append("—")
            elif target in (DIRECT, FLOOR):
                row.append(_num(value, digits, sign))
            else:
                row.append(f"{_num(value, digits, sign)} ({_x(value, get(FLOOR))})")
        rows.append(row)
    title = f"{UPSTREAMS[m.stack.upstream]}: sluicegate vs the pass-through (ratio to it)"
    headers = ["target", *(c[0] for c in columns)]
    return title + " — direct's CPU is the upstream's", headers, rows


def fixed_grid(m: Measured) -> Grid:
    """Every fixed-rate phase per target: latencies, added, paired, CPU per request."""
    rows = []
    for name in (LOW, HIGH, STREAM):
        for target in m.stack.urls:
            stat = {key: m.median(name, target, key) for key in m.phases[0].stats(target)}
            errors = sum(p.stats(target)["errors"] for p in m.phases if p.name == name)
            added = [_num(stat[k], 2, True) for k in ("added p50", "added p99", "paired")]
            rows.append(
                [
                    name,
                    target,
                    f"{errors:.0f}",
                    _num(stat["p50"], 2),
                    _num(stat["p99"], 2),
                    *(["—"] * 3 if target == DIRECT else added),
                    _num(stat["lag p99"], 2),
                    _num(stat["cpu us"]),
                    _x(stat["cpu us"], m.median(name, FLOOR, "cpu us")),
                ]
            )
    headers = "phase|target|errors|p50 ms|p99 ms|added p50|added p99|paired median|"
    headers += "launch lag p99 ms|CPU µs/req|× pass-through"
    title = f"{UPSTREAMS[m.stack.upstream]}: fixed rates per target, medians of the repeats "
    title += "(streaming: TTFT; direct's CPU: the upstream's per request answered)"
    return title, cells(headers), rows


def ceiling_grid(m: Measured) -> Grid:
    """Max sustained throughput, CPU per request there, what limited it, and memory."""
    base_rate, base_us = m.at_max(FLOOR)
    base_rss = m.memory_mb[FLOOR]
    rows = []
    for target in m.stack.urls:
        rate, proxy_us = m.at_max(target)
        top = [s for s in m.steps[target] if s.passed and s.offered == rate]
        engine_us = top[-1].us_per_request(ENGINE) if top else math.nan
        rss, peak = m.memory_mb.get(target, (math.nan, math.nan))
        rows.append(
            [
                target,
                _num(rate),
                _x(rate, base_rate),
                "—" if target == DIRECT else _num(proxy_us),
                "—" if target == DIRECT else _x(proxy_us, base_us),
                _num(engine_us),
                limiter(m.steps[target], rate),
                _num(rss),
                _num(peak),
                _x(rss, base_rss[0]),
            ]
        )
    headers = "target|max sustained req/s|× pass-through|proxy µs/req at max|× pass-through|"
    headers += "upstream µs/req at max|limited by|RSS MB|peak RSS MB|RSS × pass-through"
    return f"{UPSTREAMS[m.stack.upstream]}: max sustained throughput", cells(headers), rows


def targets_grid(measured: Sequence[Measured]) -> Grid:
    """Issue 18's targets for every sluicegate target and upstream, with their margins."""
    rows = []
    for m in measured:
        where = "fake" if m.stack.upstream == "fake" else "emulator"
        for g in m.stack.gateways:
            shared, g_us, floor_us = m.shared_ceiling(g)
            cpu = {
                f"at {shared:,.0f}/s (the highest rate both sustained)": g_us / floor_us,
                "each at its own max": m.at_max(g)[1] / m.at_max(FLOOR)[1],
                "@300/s": m.median(HIGH, g, "cpu us") / m.median(HIGH, FLOOR, "cpu us"),
                "@100/s": m.median(LOW, g, "cpu us") / m.median(LOW, FLOOR, "cpu us"),
            }
            for label, ratio in cpu.items():
                limit = CPU_RATIO_LOW_RATE if label == "@100/s" else CPU_RATIO
                text = f"{where}: {g} CPU/req {label} vs pass-through"
                rows.append(bar_row(text, ratio, limit, "×", upper=True))
            p50, p99 = m.median(LOW, g, "added p50"), m.median(HIGH, g, "added p99")
            rows.append(
                bar_row(f"{where}: {g} added p50 @100/s", p50, ADDED_P50_MS, "ms", upper=True)
            )
            rows.append(
                bar_row(f"{where}: {g} added p99 @300/s", p99, ADDED_P99_MS, "ms", upper=True)
            )
    return bars_grid(rows, "Issue 18 targets")


def floor_grid(measured: Sequence[Measured]) -> Grid:
    """Issue 33's bars for every sluicegate target, in front of the tiny upstream (no rows
    when it was not measured)."""
    rows = []
    for m in measured:
        if m.stack.upstream != "fake":
            continue
        base_rate, base_us = m.at_max(FLOOR)
        base_p99 = m.median(HIGH, FLOOR, "added p99")
        for g in m.stack.gateways:
            rate, us = m.at_max(g)
            p99 = m.median(HIGH, g, "added p99")
            rows += [
                bar_row(f"{g}: CPU/req at its max vs pass-through", us / base_us, FLOOR_CPU,
                        "×", upper=True),
                bar_row(f"{g}: max req/s vs pass-through", rate / base_rate, FLOOR_RATE, "×",
                        upper=False),
                bar_row(f"{g}: added p99 @300/s − the pass-through's", p99 - base_p99,
                        FLOOR_P99_MS, "ms", upper=True),
                bar_row(f"{g}: CPU/req at its max vs pass-through (stretch)", us / base_us,
                        STRETCH_CPU, "×", upper=True),
            ]  # fmt: skip
    return bars_grid(rows, "Issue 33 targets (tiny aiohttp upstream)")


def _arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="shorter phases and steps")
    parser.add_argument("--smoke", action="store_true", help="a tiny run: checks, not figures")
    parser.add_argument("--repeats", type=int, default=3, help="of the fixed-rate phases")
    parser.add_argument("--upstream", choices=(*UPSTREAMS, "both"), default="both")
    parser.add_argument(
        "--section", default="bench_floor", help="name of the section --write replaces"
    )
    parser.add_argument("--preset", default="instant", help="emulator engine preset")
    parser.add_argument("--phase-s", type=float, default=10.0, help="seconds per rate phase")
    parser.add_argument("--stream-s", type=float, default=6.0, help="streaming phase seconds")
    parser.add_argument("--stream-tokens", type=int, default=16, help="max_tokens streamed")
    parser.add_argument(
        "--unary-tokens", type=int, default=2, help="max_tokens of the non-streamed requests"
    )
    parser.add_argument("--warmup-s", type=float, default=3.0)
    parser.add_argument("--pause-s", type=float, default=0.5, help="rest between phases")
    parser.add_argument("--start-rate", type=float, default=200.0, help="first saturation step")
    parser.add_argument("--max-rate", type=float, default=12_800.0)
    parser.add_argument("--step-s", type=float, default=3.0, help="seconds per saturation step")
    parser.add_argument("--refine", type=int, default=3, help="bisections after the ramp")
    parser.add_argument("--p99-limit-ms", type=float, default=1000.0)
    parser.add_argument("--noisy-cores", type=float, default=0.25, help="retry threshold")
    parser.add_argument("--label", default="sluicegate", help="name of the sluicegate target")
    parser.add_argument(
        "--config", action="append", choices=sorted(LANE_SETUPS), default=None,
        help="the lane's set-up (repeatable: one sluicegate each, side by side): never "
        "(preemptible: never), default (preemptible unset), requeue (unset, "
        "preempt_action: requeue), always (preemptible: always: every non-streamed request "
        "reassembled); default: never and default",
    )  # fmt: skip
    parser.add_argument(
        "--site",
        default=None,
        help="PYTHONPATH of every sluicegate target, e.g. build/wheel-site (make "
        "test-compiled installs there the wheel pip builds, compiled core included)",
    )
    parser.add_argument(
        "--gateway-arg", action="append", default=[], help="extra serve args (repeatable, split)"
    )
    parser.add_argument(
        "--variant", action="append", default=[], metavar="NAME=ARGS",
        help="one more sluicegate target started with `serve ... ARGS` (repeatable)",
    )  # fmt: skip
    parser.add_argument(
        "--title",
        default="Per-request cost at the Python floor: sluicegate vs the aiohttp pass-through",
        help="heading of the section --write replaces",
    )
    parser.add_argument("--write", type=Path, default=None, help="Markdown file to update")
    parser.set_defaults(generator="lean")
    args = parser.parse_args(argv)
    args.config = list(dict.fromkeys(args.config or ["never", "default"]))
    quick = {"phase_s": 4.0, "stream_s": 3.0, "warmup_s": 2.0, "step_s": 1.5, "refine": 2}
    smoke = {"repeats": 1, "phase_s": 1.0, "stream_s": 1.0, "warmup_s": 0.5, "step_s": 0.5}
    smoke |= {"refine": 0, "max_rate": 400.0}
    return apply_presets(parser, args, [smoke] * args.smoke + [quick] * args.quick)


def main(argv: list[str] | None = None) -> int:
    """Measure in front of each upstream in turn, print the tables, optionally write them."""
    args = _arguments(argv)
    console = wide_console()
    measured: list[Measured] = []
    upstreams = list(UPSTREAMS) if args.upstream == "both" else [args.upstream]
    for upstream in upstreams:
        with tempfile.TemporaryDirectory(prefix=f"sluicegate-floor-{upstream}-") as tmp:
            log_dir = Path(tmp)
            try:
                with (
                    stack(upstream, args, log_dir) as running,
                    asyncio.Runner(loop_factory=fast_loop) as runner,
                ):
                    measured.append(runner.run(measure(running, args, console)))
            except BaseException:
                for log in sorted(log_dir.glob("*.log")):
                    console.print(f"[red]{log.name}[/red]\n{log.read_text()[-2000:]}")
                raise
    grids = [grid for grid in (floor_grid(measured), targets_grid(measured)) if grid[2]]
    for m in measured:
        grids += [summary_grid(m), fixed_grid(m), ceiling_grid(m)]
    steps = [
        (f"{title} — {UPSTREAMS[m.stack.upstream]}", headers, rows)
        for m in measured
        for title, headers, rows in [steps_grid(m.steps, list(m.stack.urls))]
    ]
    others = [p.others for m in measured for p in m.phases]
    gateways = ", ".join(
        f"{name} (`serve --config …{''.join(' ' + a for a in extra)}`, lane "
        f"`{LANE_SETUPS[setup].lstrip(', ') or 'preemptible unset'}`)"
        for name, (setup, extra) in gateway_args(args).items()
    )
    upstream_names = "; ".join(UPSTREAMS[u] for u in upstreams).replace(
        "emulator", f"emulator (preset `{args.preset}`)"
    )
    notes = [
        f"Upstreams: {upstream_names}. Targets: direct, the aiohttp "
        f"pass-through, {gateways}; one model, one slack lane, one keyed tenant, metrics and "
        "a 1 s scrape on.",
        f"Fixed rates, all targets at once, interleaved: {LOW_RATE:g} and {HIGH_RATE:g} "
        f"req/s per target for {args.phase_s:g} s ({args.unary_tokens} tokens), streaming "
        f"({args.stream_tokens} tokens) at {LOW_RATE:g} req/s for {args.stream_s:g} s; "
        f"each run {args.repeats}×, medians. "
        f"Saturation: {args.step_s:g} s steps from {args.start_rate:g} req/s, pass = achieved "
        f"≥ 95% of offered, p99 < {args.p99_limit_ms:g} ms, no errors.",
        *(
            [f"Every sluicegate runs from `{args.site}` (PYTHONPATH), the rest from the checkout."]
            if args.site
            else []
        ),
        f"Client, proxies and upstream share the machine. Background load (processes not ours) "
        f"during the fixed-rate phases: median {np.median(others):.2f}, max {max(others):.2f} "
        f"of {os.cpu_count()} cores.",
    ]
    title = args.title
    write_report(
        args, script="bench_floor.py", section=args.section, title=title, notes=notes,
        grids=[*grids, *steps], argv=argv, out=console,
    )  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
