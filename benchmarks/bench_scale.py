"""Scale: what one gateway process spends per request as the waiting queue (100 → 10,000)
and the number of tenants (1 → 1,000) grow.

The gateway serves two models. ``hold`` (one emulated engine, preset
``independent``) runs one request at a time in a lane that queues up to 20,000
with an hour's timeout and the ``fair`` policy: the benchmark parks N requests
there, each an open HTTP connection waiting its turn behind one that takes
1,000 s. ``fast`` (an ``instant`` engine, 256 slots) then receives a measured
open-loop stream of small non-streaming chats at ``--rate``. Per point: the
gateway's CPU (``/proc``) while idle with N waiting, and per request of the
stream (raw, and net of the idle rate), the one-core ceiling that implies
(10⁶ / net µs), the stream's latency and the queue depth before and after.

Two sweeps, each on a fresh gateway: waiting N with one tenant (all requests
signed by one API key); then T tenants configured (T keys), ``--tenant-depth``
requests waiting spread over them, the stream signed round-robin by all T.
Bar: cost per request flat, max / min of the net µs within a sweep ≤ ``BAR_SPREAD``.

    python benchmarks/bench_scale.py [--full | --smoke] [--write docs/BENCHMARKS.md]
"""

from __future__ import annotations

import argparse
import asyncio
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console

from livestack import (
    LiveStack,
    Process,
    live_stack,
    raise_open_files,
    wide_console,
    write_report,
)
from scale_queue import HOLD, Holder, key, wait_for_depth, waiting
from sluicegate.bench.loadgen import run_load
from sluicegate.bench.records import RequestRecord
from sluicegate.config import ServerSpec
from sluicegate.outcomes import WorkloadRequest
from tables import Grid, bar_row, bars_grid, cells, ms, percentile_ms

FAST = "fast"
BAR_SPREAD = 1.25
KEY_ENV = "SLUICEGATE_BENCH_KEY_{}"
UPSTREAM_TIMEOUTS = ("upstream_read_timeout_s", "upstream_first_byte_timeout_s")
MODES: dict[str, dict[str, object]] = {
    "smoke": {"depths": [0, 50], "tenants": [20], "tenant_depth": 20, "rate": 50.0,
              "requests": 60, "repeats": 2, "warmup": 10, "idle_s": 0.3},
    "quick": {"depths": [0, 100, 1000, 10_000], "tenants": [1, 10, 100, 1000],
              "tenant_depth": 1000, "rate": 150.0, "requests": 600, "repeats": 3, "warmup": 75,
              "idle_s": 2.0},
    "full": {"depths": [0, 100, 300, 1000, 3000, 10_000], "tenants": [1, 10, 100, 300, 1000],
             "tenant_depth": 1000, "rate": 150.0, "requests": 3000, "repeats": 5,
             "warmup": 150, "idle_s": 5.0},
}  # fmt: skip


def gateway_config(hold_url: str, fast_url: str, tenants: int, max_queue: int) -> str:
    """Both models and ``tenants`` tenants, each with its key in ``KEY_ENV``."""
    lines = [
        "models:",
        f"  - name: {HOLD}",
        f'    backends: [{{name: h0, url: "{hold_url}", engine: emulator}}]',
        "    max_concurrency: 1",
        "    lanes:",
        f"      - {{name: interactive, max_concurrency: 1, max_queue: {max_queue}, "
        "queue_timeout_s: 3600, slo_ms: 3600000, policy: fair, preemptible: never}",
        f"  - name: {FAST}",
        f'    backends: [{{name: f0, url: "{fast_url}", engine: emulator}}]',
        "    max_concurrency: 256",
        "    lanes:",
        "      - {name: interactive, max_concurrency: 256, max_queue: 4096, "
        "queue_timeout_s: 30, slo_ms: 20000, policy: slack, preemptible: never}",
        "tenants:",
        *(f"  - {{name: t{i}, api_key_env: {KEY_ENV.format(i)}}}" for i in range(tenants)),
    ]
    return "\n".join(lines) + "\n"


@dataclass(frozen=True, slots=True)
class Point:
    """One measurement: ``depth`` waiting, ``tenants`` signing, repeated streams of requests.

    Attributes:
        raw_us: per stream, gateway CPU µs per request, idle work included.
        net_us_all: per stream, the same less the idle rate × the stream's duration.
    """

    sweep: str
    depth: int
    tenants: int
    waiting_before: int
    waiting_after: int
    requests: int
    ok: int
    achieved_rps: float
    p50_ms: float
    p99_ms: float
    idle_cores: float
    raw_us: tuple[float, ...]
    net_us_all: tuple[float, ...]

    @property
    def us_per_request(self) -> float:
        """Median over the streams of the gateway's CPU µs per request."""
        return float(np.median(self.raw_us))

    @property
    def net_us(self) -> float:
        """Median over the streams of the net CPU µs per request."""
        return float(np.median(self.net_us_all))


def stream(args: argparse.Namespace, tenants: int, n: int) -> list[WorkloadRequest]:
    """``n`` small chats at ``args.rate``, signed round-robin by the tenants."""
    return [WorkloadRequest(i / args.rate, 16, 2, 2, tenant=f"t{i % tenants}") for i in range(n)]


def completion_rate(records: Sequence[RequestRecord]) -> float:
    """Successful completions per second, first to last."""
    ends = sorted(r.finished_s for r in records if r.ok)
    return (len(ends) - 1) / (ends[-1] - ends[0]) if len(ends) > 1 else math.nan


async def measure(
    gateway: Process, sweep: str, depth: int, tenants: int, args: argparse.Namespace
) -> Point:
    """With ``depth`` already waiting: idle CPU, a discarded warm-up stream, then
    ``args.repeats`` measured streams of ``args.requests`` requests in all."""
    before = await waiting(gateway.url)
    idle = gateway.cpu_s()
    await asyncio.sleep(args.idle_s)
    idle_cores = (gateway.cpu_s() - idle) / args.idle_s
    keys = {f"t{i}": key(i) for i in range(tenants)}
    options: dict[str, Any] = {"base_url": gateway.url, "model": FAST, "api_keys": keys}
    options.update(stream=False, send_lane_headers=False, timeout_s=30.0)
    await run_load(stream(args, tenants, args.warmup), **options)
    records: list[RequestRecord] = []
    raw, net, rates = [], [], []
    for _ in range(args.repeats):
        schedule = stream(args, tenants, args.requests // args.repeats)
        cpu = gateway.cpu_s()
        result = await run_load(schedule, **options)
        cpu = gateway.cpu_s() - cpu
        records += result.records
        rates.append(completion_rate(result.records))
        raw.append(cpu / len(schedule) * 1e6)
        net.append((cpu - idle_cores * result.duration_s) / len(schedule) * 1e6)
    ok = [r for r in records if r.ok]
    e2e = [r.e2e_s for r in ok]
    return Point(
        sweep, depth, tenants, before, await waiting(gateway.url), len(records), len(ok),
        float(np.median(rates)), percentile_ms(e2e, 50), percentile_ms(e2e, 99), idle_cores,
        tuple(raw), tuple(net),
    )  # fmt: skip


async def sweep_points(
    gateway: Process,
    sweep: str,
    depths: Sequence[int],
    tenants: int,
    args: argparse.Namespace,
    *,
    control: bool = False,
) -> list[Point]:
    """Grow the waiting queue through ``depths`` (ascending), measuring at each; with
    ``control``, hang up every parked request and measure once more with none waiting."""
    holder = Holder(gateway.url, tenants)
    points = []
    try:
        for depth in depths:
            # One parked request runs (for 1,000 s) in the lane's only slot; the rest wait.
            await holder.fill(depth + 1 if depth else 0, args.fill_rate)
            await wait_for_depth(gateway.url, depth, timeout_s=30.0 + depth / 100)
            points.append(await measure(gateway, sweep, depth, tenants, args))
    finally:
        await holder.close()
    if control:
        await wait_for_depth(gateway.url, 0, timeout_s=30.0)
        points.append(await measure(gateway, sweep, 0, tenants, args))
    return points


def start_gateway(
    stack: LiveStack, engines: tuple[Process, Process], tenants: int, depth: int
) -> Process:
    """A fresh gateway with ``tenants`` tenants whose keys it reads from the environment."""
    env = {KEY_ENV.format(i): key(i) for i in range(tenants)}
    config = gateway_config(engines[0].url, engines[1].url, tenants, max(depth * 2, 1024))
    # The parked request's answer (non-streaming: its first byte is its last) must not time out.
    patience = {name: 86_400.0 for name in UPSTREAM_TIMEOUTS if name in ServerSpec.model_fields}
    return stack.gateway(config, env, server=patience)


def run(args: argparse.Namespace, out: Console) -> list[Point]:
    """Both sweeps, each on its own gateway(s); the engines are shared."""
    points: list[Point] = []
    with live_stack(out, "sluicegate-scale-") as stack:
        engines = (stack.engine(HOLD, "independent", max_num_seqs=1), stack.engine(FAST, "instant"))
        deepest = max(args.depths)
        with out.status(f"waiting sweep up to {deepest:,} waiting…"):
            gateway = start_gateway(stack, engines, 1, deepest)
            sweep = sweep_points(gateway, "waiting", args.depths, 1, args, control=True)
            points += asyncio.run(sweep)
            stack.stop(gateway)
        for tenants in args.tenants:
            with out.status(f"{tenants} tenants, {args.tenant_depth} waiting…"):
                gateway = start_gateway(stack, engines, tenants, args.tenant_depth)
                depth = [args.tenant_depth]
                points += asyncio.run(sweep_points(gateway, "tenants", depth, tenants, args))
                stack.stop(gateway)
            out.print(_line(points[-1]))
    return points


def _line(p: Point) -> str:
    return (
        f"  {p.sweep}: {p.depth} waiting, {p.tenants} tenants: {p.net_us:.0f} µs/request net, "
        f"p99 {p.p99_ms:.1f} ms, {p.ok}/{p.requests} ok"
    )


# ---------------------------------------------------------------------- output


def table(points: list[Point]) -> Grid:
    """Every point, with its cost relative to the first point of its sweep."""
    headers = cells(
        "sweep|waiting (asked)|waiting before|waiting after|tenants|requests|ok|achieved/s|"
        "p50 ms|p99 ms|gateway idle CPU|gateway µs/req|net µs/req|net, streams' range|"
        "1-core req/s|vs first"
    )
    rows, first = [], dict[str, float]()
    for p in points:
        base = first.setdefault(p.sweep, p.net_us)
        rows.append(
            cells(
                f"{p.sweep}|{p.depth:,}|{p.waiting_before:,}|{p.waiting_after:,}|{p.tenants:,}|"
                f"{p.requests}|{p.ok}|{p.achieved_rps:.0f}|{ms(p.p50_ms, 2)}|{ms(p.p99_ms, 2)}|"
                f"{p.idle_cores:.1%}|{p.us_per_request:.0f}|{p.net_us:.0f}|"
                f"{min(p.net_us_all):.0f}–{max(p.net_us_all):.0f}|"
                f"{1e6 / p.net_us:.0f}|{p.net_us / base:.2f}×"
            )
        )
    return "Gateway CPU per request", headers, rows


def spread(points: list[Point], sweep: str) -> float:
    """max / min of the net cost per request within ``sweep``."""
    costs = [p.net_us for p in points if p.sweep == sweep]
    return max(costs) / min(costs) if costs and min(costs) > 0 else math.nan


def bars(points: list[Point]) -> Grid:
    """Cost per request flat across each sweep."""
    rows = [
        bar_row(
            f"net µs/request, max / min over {label}", spread(points, sweep), BAR_SPREAD, "×",
            upper=True,
        )
        for sweep, label in (("waiting", "waiting depth"), ("tenants", "tenant count"))
    ]  # fmt: skip
    lost = sum(p.requests - p.ok for p in points)
    moved = sum(p.waiting_before != p.depth or p.waiting_after != p.depth for p in points)
    rows.append(bar_row("stream requests failed", lost, 0, "", upper=True, digits=0))
    rows.append(bar_row("points whose queue was not as asked", moved, 0, "", upper=True, digits=0))
    return bars_grid(rows, "Scale bars (issue: scale)")


def arguments(argv: list[str] | None) -> argparse.Namespace:
    """Parse the command line; ``--full``/``--smoke`` pick the sweep (default: quick)."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--full", action="store_true", help="more points (about 7 minutes)")
    mode.add_argument("--smoke", action="store_true", help="tiny queues, for the test suite")
    parser.add_argument("--fill-rate", type=float, default=500.0, help="parked requests/s")
    parser.add_argument("--write", type=Path, default=None, help="Markdown file to update")
    args = parser.parse_args(argv)
    args.mode = "full" if args.full else "smoke" if args.smoke else "quick"
    for name, value in MODES[args.mode].items():
        setattr(args, name, value)
    return args


def main(argv: list[str] | None = None) -> int:
    """Run both sweeps; print and optionally write the tables."""
    args = arguments(argv)
    out = wide_console()
    need = max(*args.depths, args.tenant_depth) + 1024
    limit = raise_open_files(2 * need)
    if limit < need:
        out.print(f"[red]open-file limit {limit} < {need} needed; raise `ulimit -Hn`[/red]")
        return 2
    points = run(args, out)
    notes = [
        f"Mode: {args.mode}. Per point: {args.warmup} discarded, then {args.repeats} streams of "
        f"{args.requests // args.repeats} non-streaming chats (16-token prompt, 2 tokens out) "
        f"at {args.rate:g}/s to an `instant` engine; CPU figures are the median over the "
        f"streams. Idle CPU measured over {args.idle_s:g} s before; net = gateway CPU during "
        "a stream less the idle rate × its duration. Tenants sweep: "
        f"{args.tenant_depth:,} waiting, spread over the tenants. Generator, gateway and "
        "engines share the machine; CPU is the gateway process's own (user + system). "
        "The last `waiting` row is a control: none waiting again, measured after every "
        "parked request hung up, so its distance from the first row is the drift of the "
        "machine itself.",
    ]
    write_report(
        args, script="bench_scale.py", section="bench_scale",
        title="Scale: gateway CPU per request vs waiting requests and tenants", notes=notes,
        grids=[bars(points), table(points)], argv=argv, out=out,
    )  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
