"""What ``bench_floor.py`` measures in front of one upstream: the fixed-rate phases (every
target offered the same open-loop rate at once, ``--repeats`` times), the saturation
probe, and each proxy's memory; with the medians and like-for-like figures its tables use."""

from __future__ import annotations

import argparse
import asyncio
import math
import time
from dataclasses import dataclass, field

import numpy as np
import orjson
from rich.console import Console

from floor_stack import DIRECT, ENGINE, FLOOR, KEY, Sample, Stack, paced
from overhead_stack import MODEL, PROMPT_TOKENS
from proc_usage import cpu_seconds, memory_mb
from saturation_probe import Probe, Step, saturation
from sluicegate.bench.loadgen import build_body, endpoint_url
from sluicegate.outcomes import WorkloadRequest
from tables import percentile_ms

LOW, HIGH, STREAM = "100/s", "300/s", "stream 100/s"
LOW_RATE, HIGH_RATE = 100.0, 300.0  # req/s per target: where issue 18 sets its bars


@dataclass(frozen=True, slots=True)
class Phase:
    """One fixed-rate phase: every target's samples and the CPU each process used."""

    name: str
    requests: int
    samples: dict[str, list[Sample]]
    cpu_s: dict[str, float]
    wall_s: float

    def stats(self, target: str) -> dict[str, float]:
        """Percentiles (ms; TTFT for a streaming phase), added vs direct, paired median,
        errors, and CPU µs per request of the target's proxy (direct: of the upstream,
        per request it answered in the phase)."""
        ttft = self.name == STREAM
        values = {s[0]: s[3] if ttft else s[2] for s in self.samples[target] if not s[4]}
        base = {s[0]: s[3] if ttft else s[2] for s in self.samples[DIRECT] if not s[4]}
        stats = {"errors": float(len(self.samples[target]) - len(values))}
        for q in (50, 99):
            stats[f"p{q}"] = percentile_ms(list(values.values()), q)
            stats[f"added p{q}"] = stats[f"p{q}"] - percentile_ms(list(base.values()), q)
        stats["paired"] = percentile_ms([values[i] - base[i] for i in values.keys() & base], 50)
        stats["lag p99"] = percentile_ms([s[1] for s in self.samples[target]], 99)
        if target == DIRECT:
            answered = self.requests * len(self.samples)
            stats["cpu us"] = self.cpu_s.get(ENGINE, math.nan) / answered * 1e6
        else:
            stats["cpu us"] = self.cpu_s.get(target, math.nan) / self.requests * 1e6
        return stats

    @property
    def others(self) -> float:
        """Cores busy with processes that are not ours during the phase."""
        ours = sum(v for role, v in self.cpu_s.items() if role != "machine")
        return max(0.0, self.cpu_s.get("machine", ours) - ours) / self.wall_s


async def phase(
    name: str, s: Stack, rate: float, seconds: float, *, stream: bool, tokens: int
) -> Phase:
    """Offer ``rate`` per target for ``seconds`` to every target at once."""
    n = max(20, round(rate * seconds))
    request = WorkloadRequest(0.0, PROMPT_TOKENS, tokens, tokens)
    body = build_body(request, 0, model=MODEL, endpoint="chat", stream=stream, ignore_eos=True)
    urls = {target: endpoint_url(url, "chat") for target, url in s.urls.items()}
    before, wall = cpu_seconds(s.pids), time.monotonic()
    samples = await paced(urls, n, rate, orjson.dumps(body), stream=stream, timeout_s=30.0)
    wall, after = time.monotonic() - wall, cpu_seconds(s.pids)
    cpu = {role: after[role] - before[role] for role in after if role in before}
    return Phase(name, n, samples, cpu, wall)


@dataclass(slots=True)
class Measured:
    """Everything measured in front of one upstream."""

    stack: Stack
    phases: list[Phase] = field(default_factory=list)
    steps: dict[str, list[Step]] = field(default_factory=dict)
    probes: dict[str, Probe] = field(default_factory=dict)
    memory_mb: dict[str, tuple[float, float]] = field(default_factory=dict)

    def median(self, phase_name: str, target: str, key: str) -> float:
        """The median over the repeats of one statistic of one target in one phase."""
        found = [p.stats(target)[key] for p in self.phases if p.name == phase_name]
        found = [v for v in found if not math.isnan(v)]
        return float(np.median(found)) if found else math.nan

    def shared_ceiling(self, target: str) -> tuple[float, float, float]:
        """The highest offered rate that both ``target`` and the pass-through sustained in
        a step of exactly that rate (the ramp's doubling rates are common to all), and
        the CPU µs per request of each there: the like-for-like comparison near
        saturation (each at its own ceiling flatters whichever batches more there)."""
        rates = {s.offered for s in self.steps[target] if s.passed} & {
            s.offered for s in self.steps[FLOOR] if s.passed
        }
        if not rates:
            return math.nan, math.nan, math.nan
        rate = max(rates)

        def cpu(name: str) -> float:
            step = [s for s in self.steps[name] if s.passed and s.offered == rate][-1]
            return step.us_per_request(name)

        return rate, cpu(target), cpu(FLOOR)

    def at_max(self, target: str) -> tuple[float, float]:
        """Highest passing rate and the proxy's (direct: upstream's) CPU µs per request there."""
        best = self.probes[target].lo
        passed = [s for s in self.steps[target] if s.passed and s.offered == best]
        role = ENGINE if target == DIRECT else target
        return best, passed[-1].us_per_request(role) if passed else math.nan


async def measure(s: Stack, args: argparse.Namespace, console: Console) -> Measured:
    """Warm up, the fixed-rate phases ``--repeats`` times, the saturation probe, memory."""
    result = Measured(s)
    with console.status(f"{s.upstream}: warming up…"):
        await phase("warmup", s, LOW_RATE, args.warmup_s, stream=False, tokens=args.unary_tokens)
        await phase("warmup", s, LOW_RATE, 1.0, stream=True, tokens=args.stream_tokens)
    plan = [
        (LOW, LOW_RATE, args.phase_s, False, args.unary_tokens),
        (HIGH, HIGH_RATE, args.phase_s, False, args.unary_tokens),
        (STREAM, LOW_RATE, args.stream_s, True, args.stream_tokens),
    ]
    for repeat in range(args.repeats):
        for name, rate, seconds, stream, tokens in plan:
            with console.status(f"{s.upstream}: {name}, repeat {repeat + 1}/{args.repeats}…"):
                done = await phase(name, s, rate, seconds, stream=stream, tokens=tokens)
            result.phases.append(done)
            line = ", ".join(f"{t} {done.stats(t)['p50']:.2f} ms" for t in s.urls)
            console.print(f"  {s.upstream} {name} #{repeat + 1}: p50 {line}")
            await asyncio.sleep(args.pause_s)
    console.print(f"{s.upstream}: saturation probe")
    targets = list(s.urls)
    result.steps, result.probes = await saturation(
        s.urls, args, console, targets=targets, pids=s.pids, api_keys={"default": KEY}
    )
    result.memory_mb = {name: memory_mb(s.pids[name]) for name in targets if name != DIRECT}
    return result
