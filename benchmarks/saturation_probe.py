"""The open-loop saturation probe of the live benchmarks (``bench_overhead``, ``bench_floor``):
per target, steps at a doubling rate, then geometric bisection between the last pass and
the first failure, the targets taking turns; each step judged (kept pace, p99, errors) and
the CPU every watched process used in it recorded, with the tables of the steps."""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp
import numpy as np
import orjson
from rich.console import Console

from overhead_stack import MODEL, PROMPT_TOKENS, TARGETS, child_pids
from proc_usage import cpu_seconds
from sluicegate.bench.loadgen import build_body, build_headers, endpoint_url, run_load
from sluicegate.outcomes import WorkloadRequest
from tables import Grid, cells, pct, percentile_ms, us

KEEP_PACE = 0.95


@dataclass(frozen=True, slots=True)
class Step:
    """One open-loop step against one target.

    Attributes:
        target: which target.
        requests: how many requests the step sent.
        offered: scheduled rate, requests/s.
        launched: rate the generator actually launched at.
        achieved: rate completions came back at, ``(n_ok − 1) / span of their end times``.
        p99_ms: 99th-percentile latency of the step's successful requests.
        errors: failed requests by kind (HTTP status or exception class).
        lag_p99_ms: the generator's launch-lag p99.
        cpu_s: role → CPU seconds used during the step (client, proxy, engine, machine).
        wall_s: the step's wall time, until its last response.
        passed: completions kept pace, p99 under the limit, no errors.
    """

    target: str
    requests: int
    offered: float
    launched: float
    achieved: float
    p99_ms: float
    errors: Counter[str]
    lag_p99_ms: float
    cpu_s: dict[str, float]
    wall_s: float
    passed: bool

    def share(self, role: str) -> float:
        """Cores ``role`` kept busy on average during the step (NaN if not watched)."""
        return self.cpu_s.get(role, math.nan) / self.wall_s

    def us_per_request(self, role: str) -> float:
        """CPU microseconds ``role`` spent per request of the step."""
        return self.cpu_s.get(role, math.nan) / self.requests * 1e6

    @property
    def others(self) -> float:
        """Cores busy with processes that are not ours (other users of the machine, the kernel)."""
        ours = sum(v for role, v in self.cpu_s.items() if role != "machine")
        return max(0.0, self.cpu_s.get("machine", ours) - ours) / self.wall_s

    @property
    def generator_bound(self) -> bool:
        """The generator could not launch at the offered rate: the step measured the client."""
        return self.launched < KEEP_PACE * self.offered


Sample = tuple[float, float, float, str]
"""(scheduled start, launch lag, latency, error) of one request, seconds from the step's start;
the error is ``""`` for a 200, else the status or the exception's class name."""


async def _lean(
    url: str, body: bytes, headers: dict[str, str], n: int, rate: float, timeout_s: float
) -> list[Sample]:
    """Launch ``n`` identical POSTs at a constant ``rate``; never wait for a response to launch."""
    clock = time.perf_counter  # uvloop's loop.time() ticks in whole milliseconds
    samples: list[Sample] = []

    async def one(at: float, start: float) -> None:
        launched = clock()
        try:
            async with session.post(url, data=body, headers=headers) as response:
                await response.read()
                error = "" if response.status == 200 else f"HTTP {response.status}"
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            error = type(exc).__name__
        samples.append((at, launched - start - at, clock() - launched, error))

    connector = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        start = clock()
        async with asyncio.TaskGroup() as group:
            for i in range(n):
                delay = start + i / rate - clock()
                if delay > 0.0:
                    await asyncio.sleep(delay)
                group.create_task(one(i / rate, start))
    return samples


async def _with_run_load(url: str, n: int, rate: float, timeout_s: float) -> list[Sample]:
    schedule = [WorkloadRequest(i / rate, PROMPT_TOKENS, 2, 2) for i in range(n)]
    options: dict[str, Any] = {"model": MODEL, "api_keys": {}, "timeout_s": timeout_s}
    result = await run_load(schedule, base_url=url, stream=False, **options)
    return [
        (r.scheduled_s, r.launch_lag_s, r.e2e_s, r.error or ("" if r.ok else f"HTTP {r.status}"))
        for r in result.records
    ]


async def step(
    url: str,
    target: str,
    rate: float,
    args: argparse.Namespace,
    pids: Mapping[str, int],
    api_keys: Mapping[str, str] | None = None,
) -> Step:
    """Offer ``rate`` requests/s to ``url`` for ``args.step_s`` seconds and judge the step.

    ``api_keys`` (workload tenant → key) sends the lean generator's requests with a key."""
    n = max(20, round(rate * args.step_s))
    timeout_s = args.step_s + 10.0
    before, wall = cpu_seconds(pids), time.monotonic()
    if args.generator == "run_load":
        samples = await _with_run_load(url, n, rate, timeout_s)
    else:
        tokens = getattr(args, "unary_tokens", 2)
        request = WorkloadRequest(0.0, PROMPT_TOKENS, tokens, tokens)
        body = orjson.dumps(
            build_body(request, 0, model=MODEL, endpoint="chat", stream=False, ignore_eos=True)
        )
        headers = build_headers(request, api_keys=api_keys or {}, send_lane_headers=True)
        samples = await _lean(endpoint_url(url, "chat"), body, headers, n, rate, timeout_s)
    wall = time.monotonic() - wall
    after = cpu_seconds(pids)
    cpu_s = {role: after[role] - before[role] for role in after if role in before}
    ok = [s for s in samples if not s[3]]
    ends = sorted(s[0] + s[1] + s[2] for s in ok)
    launches = sorted(s[0] + s[1] for s in samples)
    achieved = (len(ends) - 1) / (ends[-1] - ends[0]) if len(ends) > 1 else 0.0
    launched = (len(launches) - 1) / max(launches[-1] - launches[0], 1e-9)
    p99 = percentile_ms([s[2] for s in ok], 99)
    errors = Counter(s[3] for s in samples if s[3])
    passed = not errors and achieved >= KEEP_PACE * rate and p99 < args.p99_limit_ms
    lag = percentile_ms([s[1] for s in samples], 99)
    return Step(target, n, rate, launched, achieved, p99, errors, lag, cpu_s, wall, passed)


@dataclass(slots=True)
class Probe:
    """Search state of one target's ceiling: ramp ×2 from ``start`` until a step fails, then
    bisect geometrically (``√(lo·hi)``) ``refine`` times; a first-step failure halves down."""

    start: float
    max_rate: float
    refine: int
    lo: float = 0.0
    hi: float = math.inf
    refined: int = 0

    def next_rate(self) -> float | None:
        """The rate to try next, or ``None`` when the search is over."""
        if math.isinf(self.hi):
            rate = self.start if self.lo == 0.0 else 2.0 * self.lo
            return rate if rate <= self.max_rate else None
        if self.lo == 0.0:
            return self.hi / 2.0 if self.hi >= 2.0 else None
        rate = float(round(math.sqrt(self.lo * self.hi)))
        return rate if self.refined < self.refine and self.lo < rate < self.hi else None

    def record(self, rate: float, passed: bool) -> None:
        """Account for a step at ``rate``."""
        if self.lo > 0.0 and not math.isinf(self.hi):
            self.refined += 1
        if passed:
            self.lo = rate
        else:
            self.hi = rate


async def saturation(
    urls: dict[str, str],
    args: argparse.Namespace,
    console: Console,
    *,
    targets: Sequence[str] = TARGETS,
    pids: Mapping[str, int] | None = None,
    api_keys: Mapping[str, str] | None = None,
) -> tuple[dict[str, list[Step]], dict[str, Probe]]:
    """Probe every target's ceiling; the targets take turns, one step each, in rotating order.

    ``pids`` maps each target and ``engine`` to the process whose CPU a step records
    (default: this process's ``python -m sluicegate`` children by role)."""
    pids = child_pids() if pids is None else pids
    probes = {name: Probe(args.start_rate, args.max_rate, args.refine) for name in targets}
    steps: dict[str, list[Step]] = {name: [] for name in targets}
    for turn in range(1000):
        shift = turn % len(targets)
        order = [*targets[shift:], *targets[:shift]]
        todo = [(name, rate) for name in order if (rate := probes[name].next_rate()) is not None]
        if not todo:
            break
        for name, rate in todo:
            watched = {role: pid for role, pid in pids.items() if role in (name, "engine")}
            result = await step(urls[name], name, float(round(rate)), args, watched, api_keys)
            if not result.passed and result.others > args.noisy_cores:
                # Another user of the machine took the CPU this step needed: try it once more.
                console.print(_step_line(result) + f" (others busy {result.others:.2f} cores)")
                steps[name].append(result)
                result = await step(urls[name], name, result.offered, args, watched, api_keys)
            steps[name].append(result)
            probes[name].record(result.offered, result.passed)
            console.print(_step_line(result))
            await asyncio.sleep(args.pause_s)
    return steps, probes


def _step_line(s: Step) -> str:
    verdict = "[green]pass[/green]" if s.passed else "[red]fail[/red]"
    return (
        f"  {s.target:<12} {s.offered:7.0f}/s  launched {s.launched:7.0f}  achieved "
        f"{s.achieved:7.0f}  p99 {s.p99_ms:7.1f} ms  errors {_errors(s.errors)}  "
        f"lag p99 {s.lag_p99_ms:6.1f} ms  {verdict}"
    )


STEP_HEADERS = (
    "target|offered/s|launched/s|achieved/s|p99 ms|errors|lag p99 ms|CPU client|CPU proxy|"
    "proxy µs/req|CPU engine|CPU others|pass"
)


def _step_row(s: Step) -> list[str]:
    rates = [f"{s.offered:.0f}", f"{s.launched:.0f}", f"{s.achieved:.0f}", f"{s.p99_ms:.1f}"]
    cpu = [pct(s.share("client")), pct(s.share(s.target)), us(s.us_per_request(s.target))]
    cpu += [pct(s.share("engine")), pct(s.others)]
    verdict = "yes" if s.passed else "NO"
    return [s.target, *rates, _errors(s.errors), f"{s.lag_p99_ms:.1f}", *cpu, verdict]


def steps_grid(steps: dict[str, list[Step]], targets: Sequence[str] = TARGETS) -> Grid:
    """Every saturation step, per target in the order tried."""
    rows = [_step_row(s) for name in targets for s in steps[name]]
    title = "Saturation steps (CPU: % of one core; others: every process not ours)"
    return title, cells(STEP_HEADERS), rows


def _errors(errors: Counter[str]) -> str:
    return ", ".join(f"{n} {kind}" for kind, n in errors.most_common()) or "0"


def limiter(steps: list[Step], ceiling: float) -> str:
    """What stopped the first failing step above ``ceiling``: the generator or the target."""
    failed = [s for s in steps if not s.passed and s.offered > ceiling]
    if not failed:
        return "not reached (rate cap)"
    first = min(failed, key=lambda s: s.offered)
    busy = first.share("machine") / (os.cpu_count() or 1)
    ours = {role: first.share(role) for role in first.cpu_s if role != "machine"}
    top = max(ours, key=ours.__getitem__)
    where = "machine CPU" if busy >= 0.9 else "target"
    if first.generator_bound:
        where = f"generator, launched {first.launched:.0f}/s"
    return f"{where} at {first.offered:.0f}/s (machine {busy:.0%} busy, {top} {ours[top]:.0%})"


def cost_us(steps: list[Step], role: str, floor: float = 200.0) -> float:
    """Median CPU µs per request of ``role`` over the passing steps at ≥ ``floor`` req/s."""
    costs = [s.us_per_request(role) for s in steps if s.passed and s.offered >= floor]
    costs = [c for c in costs if not math.isnan(c)]
    return float(np.median(costs)) if costs else math.nan
