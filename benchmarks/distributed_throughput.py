"""The throughput phase of the distributed-mode benchmark: open-loop steps against each
fleet (load round-robin over its replicas), saturation_probe's ramp and bisection, the fleets
taking turns step by step, and the CPU every process used in each step."""

from __future__ import annotations

import argparse
import asyncio
import math
import os
from collections import Counter
from dataclasses import dataclass

import aiohttp
from rich.console import Console

from distributed_load import client_session, fire, spread
from distributed_stack import FAST_MODEL, Bench, Meter, store_counters
from saturation_probe import KEEP_PACE, Probe
from tables import Grid, cells, percentile_ms

__all__ = ["Step", "ceiling_grid", "fmt", "ratio", "steps_grid", "throughput"]


def _pct(share: float) -> str:
    return "—" if math.isnan(share) else f"{share * 100:.0f}%"


def fmt(value: float, digits: int = 2) -> str:
    """A figure for a table, ``—`` for NaN."""
    return "—" if math.isnan(value) else f"{value:.{digits}f}"


def ratio(value: float, base: float) -> str:
    """``value / base`` as ``1.23×``, ``—`` when either is missing."""
    return "—" if math.isnan(value) or math.isnan(base) or base <= 0 else f"{value / base:.2f}×"


@dataclass(frozen=True, slots=True)
class Step:
    """One open-loop step against one fleet.

    Attributes:
        fleet: the fleet's name.
        offered: scheduled rate, requests/s.
        launched: rate the generator actually launched at.
        achieved: rate completions came back at.
        p99_ms: 99th-percentile latency of the step's successful requests.
        errors: failed requests by kind.
        cpu_s: process name (``client``, ``machine``, gateways, ``redis``, engine) → CPU s.
        wall_s: the step's wall time.
        requests: requests sent.
        falls: how often the fleet's gateways fell back from global mode during the step.
        passed: achieved ≥ 95% of offered, p99 under the limit, no errors.
    """

    fleet: str
    offered: float
    launched: float
    achieved: float
    p99_ms: float
    errors: Counter[str]
    cpu_s: dict[str, float]
    wall_s: float
    requests: int
    falls: float
    passed: bool

    def share(self, name: str) -> float:
        """Cores ``name`` kept busy during the step."""
        return self.cpu_s.get(name, math.nan) / self.wall_s

    def us_per_request(self, names: list[str], idle: dict[str, float] | None = None) -> float:
        """CPU µs per request of the processes ``names`` together, less what they use with
        no load (``idle``: name → cores) if given."""
        idle = idle or {}
        used = sum(self.cpu_s.get(n, math.nan) - idle.get(n, 0.0) * self.wall_s for n in names)
        return used / self.requests * 1e6

    @property
    def others(self) -> float:
        """Cores busy with processes not ours (other users of the machine, the kernel)."""
        ours = sum(v for k, v in self.cpu_s.items() if k != "machine")
        return max(0.0, self.cpu_s["machine"] - ours) / self.wall_s


async def step(
    session: aiohttp.ClientSession,
    bench: Bench,
    fleet: str,
    rate: float,
    args: argparse.Namespace,
) -> Step:
    """Offer ``rate`` requests/s, round-robin over ``fleet``'s gateways, for ``args.step_s``."""
    n = max(20, round(rate * args.step_s))
    _, falls = await store_counters(session, bench.fleets[fleet])
    meter = Meter(bench.processes)
    answers = await fire(spread(bench.target(fleet, fleet), n, rate), args.step_s + 10.0)
    used, wall = meter.read()
    falls = (await store_counters(session, bench.fleets[fleet]))[1] - falls
    ok = [a for a in answers if not a.error]
    ends = sorted(a.done for a in ok)
    sends = sorted(a.sent for a in answers)
    achieved = (len(ends) - 1) / (ends[-1] - ends[0]) if len(ends) > 1 else 0.0
    launched = (len(sends) - 1) / max(sends[-1] - sends[0], 1e-9)
    p99 = percentile_ms([a.latency_s for a in ok], 99)
    errors = Counter(a.error for a in answers if a.error)
    passed = not errors and achieved >= KEEP_PACE * rate and p99 < args.p99_limit_ms
    return Step(fleet, rate, launched, achieved, p99, errors, used, wall, n, falls, passed)


async def throughput(
    bench: Bench, args: argparse.Namespace, console: Console
) -> dict[str, list[Step]]:
    """Phase 2: every fleet's ceiling; the fleets take turns, one step each, rotating."""
    names = ["mem", "one", "two", "three"]
    probes = {f: Probe(args.start_rate, args.max_rate, args.refine) for f in names}
    steps: dict[str, list[Step]] = {f: [] for f in names}
    async with client_session(10.0) as session:
        for turn in range(1000):
            order = names[turn % 4 :] + names[: turn % 4]
            todo = [(f, rate) for f in order if (rate := probes[f].next_rate()) is not None]
            if not todo:
                break
            await _turn(session, bench, todo, probes, steps, args, console)
    return steps


async def _turn(
    session: aiohttp.ClientSession,
    bench: Bench,
    todo: list[tuple[str, float]],
    probes: dict[str, Probe],
    steps: dict[str, list[Step]],
    args: argparse.Namespace,
    console: Console,
) -> None:
    """Run one step of each ``(fleet, rate)`` of ``todo`` and record it."""
    for fleet, rate in todo:
        result = await step(session, bench, fleet, float(round(rate)), args)
        if not result.passed and result.others > args.noisy_cores:
            # Another user of the machine took the CPU this step needed: try it once more.
            console.print(_step_line(result) + f" (others busy {result.others:.2f} cores)")
            steps[fleet].append(result)
            result = await step(session, bench, fleet, result.offered, args)
        steps[fleet].append(result)
        probes[fleet].record(result.offered, result.passed)
        console.print(_step_line(result))
        await asyncio.sleep(args.pause_s)


def _step_line(s: Step) -> str:
    verdict = "[green]pass[/green]" if s.passed else "[red]fail[/red]"
    return (
        f"  {s.fleet:<6} {s.offered:6.0f}/s launched {s.launched:6.0f} achieved "
        f"{s.achieved:6.0f} p99 {s.p99_ms:7.1f} ms errors {sum(s.errors.values())} {verdict}"
    )


def _gateways(bench: Bench, fleet: str) -> list[str]:
    return [g.name for g in bench.fleets[fleet].gateways]


def ceiling_grid(
    bench: Bench, steps: dict[str, list[Step]], idle: dict[str, float], floor: float
) -> Grid:
    """Per fleet: the highest passing rate, its ratio to memory mode, the CPU µs per request
    of its gateways, of Redis (less its idle load, ``idle``), of the engine and of the load
    generator, the rate at which they would fill every core (the CPU-bound ceiling, less
    sensitive than the stepping to other users of the machine), and what the first failing
    step ran out of. Costs are medians over the passing steps at ``floor`` req/s or more."""
    best = {f: max((s.offered for s in ss if s.passed), default=0.0) for f, ss in steps.items()}
    rows = []
    implied_base = math.nan
    for fleet, fleet_steps in steps.items():
        passed = [s for s in fleet_steps if s.passed and s.offered >= floor]

        def cost(names: list[str], net: dict[str, float] | None = None) -> float:
            return _median([s.us_per_request(names, net) for s in passed])  # noqa: B023

        gateways_us = cost(_gateways(bench, fleet))
        redis_us = cost(["redis"], idle) if fleet != "mem" else 0.0
        engine_us = cost([bench.engines[FAST_MODEL].name])
        client_us = cost(["client"])
        implied = (os.cpu_count() or 1) * 1e6 / (gateways_us + redis_us + engine_us + client_us)
        row = [fleet, str(len(bench.fleets[fleet].gateways)), f"{best[fleet]:.0f}"]
        row += [ratio(best[fleet], best["mem"]), fmt(gateways_us, 0)]
        row += [fmt(redis_us, 0) if fleet != "mem" else "—", fmt(engine_us, 0)]
        row += [fmt(client_us, 0), fmt(implied, 0), _limiter(bench, fleet_steps, best[fleet])]
        rows.append(row)
        implied_base = implied if fleet == "mem" else implied_base
        rows[-1].insert(-1, ratio(implied, implied_base))
    headers = "fleet|replicas|max sustained req/s|vs memory|gateways µs/req|Redis µs/req|"
    headers += "engine µs/req|load generator µs/req|CPU-bound ceiling req/s|vs memory (CPU)|"
    headers += "first failing step"
    return "Max sustained throughput, load round-robin over the replicas", cells(headers), rows


def _median(values: list[float]) -> float:
    values = sorted(v for v in values if not math.isnan(v))
    return values[len(values) // 2] if values else math.nan


def _limiter(bench: Bench, steps: list[Step], ceiling: float) -> str:
    failed = [s for s in steps if not s.passed and s.offered > ceiling]
    if not failed:
        return "none (rate cap)"
    first = min(failed, key=lambda s: s.offered)
    busy = first.share("machine") / (os.cpu_count() or 1)
    gateways = sum(first.share(g) for g in _gateways(bench, first.fleet))
    return (
        f"{first.offered:.0f}/s: machine {busy:.0%} busy; gateways {gateways:.2f}, "
        f"engine {first.share(bench.engines[FAST_MODEL].name):.2f}, "
        f"generator {first.share('client'):.2f}, Redis {first.share('redis'):.2f} cores"
    )


def steps_grid(bench: Bench, steps: dict[str, list[Step]]) -> Grid:
    """Every step, per fleet in the order tried, with each process's share of a core."""
    rows = []
    for fleet, fleet_steps in steps.items():
        for s in fleet_steps:
            row = [fleet, f"{s.offered:.0f}", f"{s.launched:.0f}", f"{s.achieved:.0f}"]
            row += [fmt(s.p99_ms, 1), str(sum(s.errors.values()))]
            row += ["/".join(_pct(s.share(g)) for g in _gateways(bench, fleet))]
            row += [_pct(s.share("redis")), _pct(s.share(bench.engines[FAST_MODEL].name))]
            idle = sum(s.share(g) for other in bench.fleets if other != fleet
                       for g in _gateways(bench, other))  # fmt: skip
            row += [_pct(s.share("client")), _pct(idle), _pct(s.others), f"{s.falls:.0f}"]
            rows.append([*row, "yes" if s.passed else "NO"])
    headers = "fleet|offered/s|launched/s|achieved/s|p99 ms|errors|CPU gateways|CPU Redis|"
    headers += "CPU engine|CPU load generator|CPU idle gateways|CPU others|store fallbacks|pass"
    return "Throughput steps (CPU: % of one core, per process)", cells(headers), rows
