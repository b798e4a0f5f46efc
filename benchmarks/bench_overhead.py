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
import random
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import orjson
from rich.console import Console

from livestack import fast_loop
from mdsection import write_section
from sluicegate.bench.loadgen import (
    LoadResult,
    build_body,
    build_headers,
    endpoint_url,
    run_load,
)
from sluicegate.bench.records import RequestRecord
from sluicegate.demo.processes import Children, children, free_port
from sluicegate.outcomes import WorkloadRequest
from tables import Grid, bar_row, bars_grid, cells, markdown, percentile_ms, render

BAR_P50_MS = 1.0
BAR_P99_MS = 5.0
BAR_RATIO = 0.70
KEEP_PACE = 0.95
MODEL = "overhead-llm"
TARGETS = ("direct", "pass-through", "sluicegate")
ROLES = {"engine": "emulate", "pass-through": "passthrough", "sluicegate": "serve"}
PROMPT_TOKENS = 16
GATEWAY_CONFIG = """\
server: {{host: 127.0.0.1, port: {port}, admin_key_env: null, scrape_interval_s: 1.0}}
models:
  - name: {model}
    backends: [{{name: e0, url: "http://127.0.0.1:{engine}", engine: emulator}}]
    max_concurrency: 256
    lanes:
      - {{name: interactive, max_concurrency: 256, max_queue: 4096, queue_timeout_s: 30,
          slo_ms: 20000, policy: slack, preemptible: never}}
      - {{name: batch, max_concurrency: 16, max_queue: 2048, queue_timeout_s: 300,
          slo_ms: 120000, policy: fair, preemptible: {{after_fraction: 0.8}}}}
      - {{name: best_effort, max_concurrency: 8, max_queue: 8192, queue_timeout_s: 600,
          slo_ms: 600000, policy: fifo, preemptible: always}}
"""


def start_targets(group: Children, preset: str, log_dir: Path) -> dict[str, str]:
    """Start the engine, the pass-through and the gateway; return each target's base URL."""
    engine, passthrough, gateway = free_port(), free_port(), free_port()
    args = ["emulate", "--port", str(engine), "--preset", preset, "--model", MODEL]
    group.start("engine", args, f"http://127.0.0.1:{engine}/health")
    group.start(
        "pass-through",
        ["passthrough", "--port", str(passthrough), "--backend", f"http://127.0.0.1:{engine}"],
        f"http://127.0.0.1:{passthrough}/health",
    )
    config = log_dir / "gateway.yaml"
    config.write_text(GATEWAY_CONFIG.format(port=gateway, model=MODEL, engine=engine))
    group.start(
        "sluicegate", ["serve", "--config", str(config)], f"http://127.0.0.1:{gateway}/readyz"
    )
    urls = (engine, passthrough, gateway)
    return {name: f"http://127.0.0.1:{port}" for name, port in zip(TARGETS, urls, strict=True)}


def child_pids() -> dict[str, int]:
    """Role → pid of this process's ``python -m sluicegate`` children (Linux ``/proc``)."""
    found: dict[str, int] = {}
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            stat = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if int(stat[1]) != os.getpid() or b"sluicegate" not in argv:
            continue
        command = argv[argv.index(b"sluicegate") + 1].decode()
        found.update({role: int(entry.name) for role, cmd in ROLES.items() if cmd == command})
    return found


def process_table() -> dict[int, tuple[int, int]]:
    """pid → (parent pid, CPU ticks used so far) of every process on the machine."""
    table: dict[int, tuple[int, int]] = {}
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        table[int(entry.name)] = (int(fields[1]), int(fields[11]) + int(fields[12]))
    return table


def process_tree(pid: int, table: Mapping[int, tuple[int, int]]) -> list[int]:
    """``pid`` and its descendants in ``table`` (from ``process_table``)."""
    tree, found = [pid], []
    while tree:
        member = tree.pop()
        found.append(member)
        tree += [child for child, (parent, _) in table.items() if parent == member]
    return found


def cpu_seconds(pids: Mapping[str, int]) -> dict[str, float]:
    """CPU seconds (user + system) used so far by each process with its descendants (a
    gateway's worker processes), by this one as ``client``, and by the whole machine as
    ``machine`` (every process, ours or not)."""
    tick = os.sysconf("SC_CLK_TCK")
    used = {"client": time.process_time()}
    table = process_table()
    for role, pid in pids.items():
        if pid in table:
            used[role] = sum(table[member][1] for member in process_tree(pid, table)) / tick
    try:
        ticks = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
        used["machine"] = (sum(ticks[:8]) - ticks[3] - ticks[4]) / tick  # all but idle, iowait
    except (OSError, ValueError, IndexError):
        pass
    return used


# --------------------------------------------------------------------- latency


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
        rows.append([*row, lag, _us(cpu_us.get(name, math.nan))])
        if name == "sluicegate":
            deltas = {"p50": added[0], "p99": added[2]}
    return (title, headers, rows), deltas


# ------------------------------------------------------------------ throughput


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
        request = WorkloadRequest(0.0, PROMPT_TOKENS, 2, 2)
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


def _pct(value: float) -> str:
    return "—" if math.isnan(value) else f"{value * 100:.0f}%"


STEP_HEADERS = (
    "target|offered/s|launched/s|achieved/s|p99 ms|errors|lag p99 ms|CPU client|CPU proxy|"
    "proxy µs/req|CPU engine|CPU others|pass"
)


def _step_row(s: Step) -> list[str]:
    rates = [f"{s.offered:.0f}", f"{s.launched:.0f}", f"{s.achieved:.0f}", f"{s.p99_ms:.1f}"]
    cpu = [_pct(s.share("client")), _pct(s.share(s.target)), _us(s.us_per_request(s.target))]
    cpu += [_pct(s.share("engine")), _pct(s.others)]
    verdict = "yes" if s.passed else "NO"
    return [s.target, *rates, _errors(s.errors), f"{s.lag_p99_ms:.1f}", *cpu, verdict]


def steps_grid(steps: dict[str, list[Step]], targets: Sequence[str] = TARGETS) -> Grid:
    """Every saturation step, per target in the order tried."""
    rows = [_step_row(s) for name in targets for s in steps[name]]
    title = "Saturation steps (CPU: % of one core; others: every process not ours)"
    return title, cells(STEP_HEADERS), rows


def _errors(errors: Counter[str]) -> str:
    return ", ".join(f"{n} {kind}" for kind, n in errors.most_common()) or "0"


def _us(value: float) -> str:
    return "—" if math.isnan(value) else f"{value:.0f}"


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
                f"{name}|{ceiling:.0f}|{ratio}|{_us(engine_us)}|{_us(proxy_us)}|"
                f"{_us(1e6 / proxy_us)}|{_pct(base_us / proxy_us)}|{limiter(steps[name], ceiling)}"
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
