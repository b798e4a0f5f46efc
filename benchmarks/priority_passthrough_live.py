"""The live phase of ``bench_priority_passthrough.py`` (``--live``): the chat/background mix
in real time through a real gateway (``sluicegate serve``) in front of a real emulator
started with vLLM's priority scheduler, with and without ``priority_passthrough``, and the
simulator's run of the very same requests and configuration beside each figure.

Engine: ``sluicegate emulate --preset llama-3.1-8b-h100 --max-num-seqs 8
--scheduling-policy priority`` (the H100 timing, a batch of 8 so that a 2-core machine
streams its ~900 tokens/s in real time; its 448 k-token KV never binds, so the engine's
queue is its waiting queue, not preemption). A fresh emulator per run. Gateway: as the
simulated ``engine queues`` set-up (no token budget, the model and both lanes capped at
1024, far above the engine's 8), so every request goes straight to the engine and waits
there. Without passthrough the gateway strips the ``priority`` field, so the priority
engine sees priority 0 everywhere and runs FCFS; with it, chat (1) runs ahead of
background (4) in the engine's waiting queue.

Requests: the first N of the Azure conversation trace, N = ρ × capacity × ``duration``,
their arrivals compressed to span ``duration`` seconds, tenants drawn by ``--seed``
(mix as the simulated table); client ``max_tokens`` = the trace's output and ``ignore_eos``
(each answer exactly that long), completions endpoint, streamed (``sluicegate bench``'s load
generator). Capacity is the simulator's (``sim/capacity.py``) for this engine without
passthrough on the first 20 minutes of the trace, mixed by the same seed. Simulated: the
same configuration (``engine: emulator`` backend with the same ``priority_passthrough``) and
requests through ``sluicegate.sim.virtual_driver.simulate``.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from livestack import CpuMeter, LiveStack, live_stack, wide_console
from sluicegate.bench.loadgen import run_load
from sluicegate.bench.records import RequestRecord
from sluicegate.config import parse_config
from sluicegate.core.spec import SchedulerSpec
from sluicegate.engine.engine_config import EngineConfig
from sluicegate.engine.presets import preset
from sluicegate.outcomes import WorkloadRequest
from sluicegate.outcomes.record import COMPLETED
from sluicegate.sim.capacity import measure_capacity
from sluicegate.sim.result import SimResult
from sluicegate.sim.virtual_driver import simulate
from sluicegate.sim.workloads import apply_mix, load_workload, parse_mix, window

MAX_NUM_SEQS = 8
SCRAPE_S = 1.0
CAPACITY_WINDOW_S = 1200.0
UNREACHABLE = "http://127.0.0.1:9"
"""The simulator's backend URL: it replaces the backend by its replica and never calls it."""


def config_text(model: str, engine_url: str, passthrough: bool) -> str:
    """The gateway's (and the simulator's) configuration: two FIFO lanes under 1024 slots,
    no token budget, one emulator backend with or without passthrough."""
    lanes = "\n".join(
        f"      - {{name: {name}, max_concurrency: 1024, max_queue: 1000000, "
        f"queue_timeout_s: 3600, slo_ms: {slo}, policy: fifo, preemptible: never}}"
        for name, slo in (("interactive", 10000), ("batch", 120000))
    )
    return f"""\
models:
  - name: {model}
    max_concurrency: 1024
    max_inflight_tokens: off
    backends: [{{name: e0, url: "{engine_url}", engine: emulator,
                 priority_passthrough: {str(passthrough).lower()}}}]
    lanes:
{lanes}
"""


def scheduler_spec(model: str, passthrough: bool) -> SchedulerSpec:
    """``config_text`` for the simulator, parsed."""
    return parse_config(config_text(model, UNREACHABLE, passthrough)).scheduler_spec()


def engine_config(preset_name: str) -> EngineConfig:
    """The emulated engine: the preset with a batch of ``MAX_NUM_SEQS``. The simulator
    switches it to the priority policy itself for a passthrough backend."""
    return dataclasses.replace(preset(preset_name), max_num_seqs=MAX_NUM_SEQS)


@dataclass(frozen=True)
class Workload:
    """The live slice, the capacity that sized it (req/s) and its rate as a multiple of the
    trace's own."""

    requests: list[WorkloadRequest]
    capacity_rps: float
    rate_scale: float


def workload(
    trace_path: Path, mix: str, model: str, preset_name: str, args: argparse.Namespace
) -> Workload:
    """The first ρ × capacity × ``duration`` trace requests, compressed to ``duration``."""
    trace = load_workload(trace_path)
    sample = apply_mix(window(trace, 0.0, CAPACITY_WINDOW_S), parse_mix(mix), seed=args.seed)
    capacity = measure_capacity(
        scheduler_spec(model, False), model, sample, engine_config(preset_name), 1
    )
    if capacity is None:
        raise SystemExit("capacity could not be measured")
    count = round(args.rho * capacity.rps * args.duration_s)
    head = trace[:count]
    t0, span = head[0].arrival_s, head[-1].arrival_s - head[0].arrival_s
    factor = args.duration_s / span
    compressed = [dataclasses.replace(r, arrival_s=(r.arrival_s - t0) * factor) for r in head]
    mixed = apply_mix(compressed, parse_mix(mix), seed=args.seed)
    return Workload(mixed, capacity.rps, 1.0 / factor)


def live_run(
    stack: LiveStack, model: str, preset_name: str, requests: list[WorkloadRequest], pt: bool
) -> tuple[list[RequestRecord], float]:
    """Replay ``requests`` through a fresh gateway and a fresh priority emulator; the
    records and the cores other processes kept busy meanwhile."""
    engine = stack.engine(
        model, preset_name, max_num_seqs=MAX_NUM_SEQS, scheduling_policy="priority"
    )
    gateway = stack.gateway(
        config_text(model, engine.url, pt), server={"scrape_interval_s": SCRAPE_S}
    )
    meter = CpuMeter([engine, gateway])
    result = asyncio.run(
        run_load(
            requests, base_url=gateway.url, model=model, api_keys={}, endpoint="completions",
            timeout_s=600.0,
        )
    )  # fmt: skip
    others = meter.others_cores()
    stack.stop(gateway)
    stack.stop(engine)
    return list(result.records), others


def simulated(model: str, preset_name: str, requests: list[WorkloadRequest], pt: bool) -> SimResult:
    """The simulator's run of the same requests on the same configuration."""
    return simulate(
        scheduler_spec(model, pt), model, requests, engine_config(preset_name), 1,
        seed=0, scrape_interval_s=SCRAPE_S,
    )  # fmt: skip


def p99(values: Sequence[float]) -> float:
    """The 99th percentile, seconds; NaN if empty."""
    return float(np.percentile(np.asarray(values), 99)) if values else math.nan


def live_p99(records: Sequence[RequestRecord], tenant: str) -> tuple[float, float, int]:
    """TTFT and e2e p99 of ``tenant``'s successful live requests, and how many there were."""
    ok = [r for r in records if r.ok and r.tenant == tenant]
    ttft = [r.ttft_s for r in ok if r.ttft_s is not None]
    return p99(ttft), p99([r.e2e_s for r in ok]), len(ok)


def sim_p99(result: SimResult, tenant: str) -> tuple[float, float]:
    """TTFT and e2e p99 (from arrival) of ``tenant``'s completed simulated requests."""
    ok = [r for r in result.records if r.tenant == tenant and r.outcome == COMPLETED]
    ttft = [r.first_token_s - r.arrival_s for r in ok if r.first_token_s is not None]
    return p99(ttft), p99([r.finish_s - r.arrival_s for r in ok if r.finish_s is not None])


def _pair(live: float, sim: float) -> list[str]:
    ratio = "—" if math.isnan(live) or not sim else f"{live / sim:.2f}"
    return [f"{live:.2f}", f"{sim:.2f}", ratio]


def rows(
    runs: dict[bool, tuple[list[RequestRecord], SimResult, float]], tenants: Sequence[str]
) -> list[str]:
    """One Markdown row per (passthrough, tenant): live, simulated and live / simulated."""
    out = []
    for pt, (records, sim, _) in runs.items():
        for tenant in tenants:
            ttft, e2e, ok = live_p99(records, tenant)
            sent = sum(1 for r in records if r.tenant == tenant)
            sim_ttft, sim_e2e = sim_p99(sim, tenant)
            cells = ["yes" if pt else "no", tenant, f"{ok}/{sent}"]
            cells += _pair(ttft, sim_ttft) + _pair(e2e, sim_e2e)
            out.append("| " + " | ".join(cells) + " |")
    return out


def run_live(
    args: argparse.Namespace,
    *,
    trace_path: Path,
    mix: str,
    model: str,
    preset_name: str,
    tenants: Sequence[str],
) -> tuple[list[str], list[str]]:
    """Both live runs and their simulated twins; the table's rows and the notes under it."""
    out = wide_console()
    load = workload(trace_path, mix, model, preset_name, args)
    runs: dict[bool, tuple[list[RequestRecord], SimResult, float]] = {}
    with live_stack(out, "sluicegate-priority-") as stack:
        for pt in (False, True):
            with out.status(f"passthrough {pt}: {len(load.requests)} requests live…"):
                records, others = live_run(stack, model, preset_name, load.requests, pt)
            runs[pt] = (records, simulated(model, preset_name, load.requests, pt), others)
            failed = sum(1 for r in records if not r.ok)
            out.print(f"passthrough {pt}: {failed} failed; background {others:.2f} cores")
    table = rows(runs, tenants)
    busy = ", ".join(f"{'with' if pt else 'without'} {c:.2f}" for pt, (_, _, c) in runs.items())
    notes = [
        f"The trace's first {len(load.requests)} requests, arrivals rescaled to span "
        f"{args.duration_s:g} s (×{load.rate_scale:.2f} the trace's rate: ρ {args.rho:g} of "
        f"the simulated capacity, {load.capacity_rps:.2f} req/s); tenant mix seed {args.seed}.",
        f"Cores kept busy by other processes during the live runs: {busy}.",
    ]
    return table, notes
