"""Priority handed to the engine (issue 30), in simulation: chat's tail with and without
``priority_passthrough``, and what background traffic pays for it.

The first 20 minutes of the shipped Azure conversation trace (client ``max_tokens`` = the
output rounded up to a power of two), 70% of requests from ``chat`` (lane
``interactive``, sluicegate priority 1, deadline 10 s) and 30% from ``background``
(lane ``batch``, priority 4, deadline 120 s), replayed at ρ × capacity on one
Llama-3.1-8B/H100 replica (preset ``llama-3.1-8b-h100``: vLLM's defaults,
``max_num_seqs`` 1024, 448 k KV tokens). Capacity is ``sim/capacity.py``'s
(completions per second under backlog) of the first set-up without passthrough; every
row offers the same rate.

Passthrough can only matter where the *engine* holds a queue, so the gateway must let in
more than the engine runs at once. Two set-ups, both with the model and each lane capped
at 1024 requests (the engine's ``max_num_seqs``, a common way to size a gateway):

* ``engine queues``: ``max_inflight_tokens: off``. The gateway counts requests only, as a
  plain proxy would; the KV cache (about 300 Azure requests) is what binds, so requests
  wait in vLLM's queue and running ones are preempted when KV runs short.
* ``gateway budget``: sluicegate's default ``max_inflight_tokens: auto`` (90% of the KV
  capacity, charged prompt + predicted output): the gateway holds the queue, visiting
  ``interactive`` before ``batch``, and the engine rarely queues.

With passthrough the replica's engine runs vLLM's priority scheduler (V1: waiting queue
by (priority, arrival), KV victim the largest (priority, arrival); no preemption to admit)
and gets each ticket's priority; without it, FCFS. Each figure is the median over
``--seeds`` seeds (each seed draws the tenant mix and seeds the engine), with the range.
With ``--live`` it runs the live phase instead (``priority_passthrough_live.py``): one
seed of the same mix in real time through ``sluicegate serve`` in front of ``sluicegate
emulate --scheduling-policy priority``, with and without passthrough, each figure beside
the simulator's for the same requests and configuration (about 3 minutes).

    python benchmarks/bench_priority_passthrough.py [--seeds 5] [--write docs/POLICIES.md]
    python benchmarks/bench_priority_passthrough.py --live [--seed 0] [--rho 0.9]
        [--duration-s 50] [--write docs/POLICIES.md]
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from mdsection import write_section
from priority_passthrough_live import MAX_NUM_SEQS, run_live
from sluicegate.config import parse_config
from sluicegate.core.spec import SchedulerSpec
from sluicegate.engine.presets import preset
from sluicegate.outcomes.record import COMPLETED
from sluicegate.sim.capacity import measure_capacity
from sluicegate.sim.result import SimResult
from sluicegate.sim.virtual_driver import simulate
from sluicegate.sim.workloads import apply_mix, load_workload, parse_mix, scale_rate, window

ROOT = Path(__file__).resolve().parents[1]
TRACE = ROOT / "data" / "traces" / "AzureLLMInferenceTrace_conv.csv"
MODEL = "llama-3.1-8b"
PRESET = "llama-3.1-8b-h100"
MIX = "0.7:chat:interactive:1:10000,0.3:background:batch:4:120000"
TENANTS = ("chat", "background")
WINDOW_S = 1200.0
LOADS = (0.9, 0.95, 1.0)
SETUPS = {"engine queues": "off", "gateway budget": "auto"}
"""Set-up label → the model's ``max_inflight_tokens``."""


def config_text(budget: str, passthrough: bool) -> str:
    """The simulated gateway: two FIFO lanes under 1024 slots, one replica."""
    lanes = "\n".join(
        f"      - {{name: {name}, max_concurrency: 1024, max_queue: 1000000, "
        f"queue_timeout_s: 3600, slo_ms: {slo}, policy: fifo, preemptible: never}}"
        for name, slo in (("interactive", 10000), ("batch", 120000))
    )
    return f"""\
models:
  - name: {MODEL}
    max_concurrency: 1024
    max_inflight_tokens: {budget}
    backends: [{{name: r0, priority_passthrough: {str(passthrough).lower()}}}]
    lanes:
{lanes}
tenants:
  - {{name: chat, default_lane: interactive}}
  - {{name: background, default_lane: batch}}
simulation: {{preset: {PRESET}, replicas: 1}}
"""


def scheduler_spec(budget: str, passthrough: bool) -> SchedulerSpec:
    """``config_text`` parsed into the scheduler's configuration."""
    return parse_config(config_text(budget, passthrough), simulation=True).scheduler_spec()


@dataclass(frozen=True)
class Figures:
    """One run's p99s (seconds) per tenant and metric, and its engine preemptions."""

    p99: dict[tuple[str, str], float]
    preemptions: int
    completed: float


def figures(result: SimResult) -> Figures:
    """TTFT and e2e p99 (from arrival) of each tenant's completed requests."""
    p99: dict[tuple[str, str], float] = {}
    done = 0
    for tenant in TENANTS:
        ok = [r for r in result.records if r.tenant == tenant and r.outcome == COMPLETED]
        done += len(ok)
        ttft = [r.first_token_s - r.arrival_s for r in ok if r.first_token_s is not None]
        e2e = [r.finish_s - r.arrival_s for r in ok if r.finish_s is not None]
        p99[tenant, "ttft"] = float(np.percentile(ttft, 99))
        p99[tenant, "e2e"] = float(np.percentile(e2e, 99))
    return Figures(p99, result.engine_preemptions, done / len(result.records))


def spread(values: Sequence[float], digits: int = 2) -> str:
    """``median (min–max)``."""
    lo, mid, hi = min(values), float(np.median(values)), max(values)
    return f"{mid:.{digits}f} ({lo:.{digits}f}–{hi:.{digits}f})"


def run(args: argparse.Namespace) -> tuple[list[str], float, float, int]:
    """Every row of the table, the capacity, the trace's own rate and its requests."""
    trace = window(load_workload(TRACE, max_tokens="pow2"), 0.0, WINDOW_S)
    engine = preset(PRESET)
    mixes = [apply_mix(trace, parse_mix(MIX), seed=seed) for seed in range(args.seeds)]
    capacity = measure_capacity(scheduler_spec("off", False), MODEL, mixes[0], engine, 1)
    if capacity is None:
        raise SystemExit("capacity could not be measured")
    trace_rps = len(trace) / WINDOW_S
    rows = []
    for label, budget in SETUPS.items():
        for rho in LOADS:
            for passthrough in (False, True):
                spec = scheduler_spec(budget, passthrough)
                runs = [
                    figures(simulate(spec, MODEL, scale_rate(w, rho * capacity.rps / trace_rps),
                                     engine, 1, seed=seed))
                    for seed, w in enumerate(mixes)
                ]  # fmt: skip
                cells = [label, f"{rho:g}", "yes" if passthrough else "no"]
                for tenant in TENANTS:
                    cells += [spread([f.p99[tenant, m] for f in runs]) for m in ("ttft", "e2e")]
                cells.append(spread([float(f.preemptions) for f in runs], 0))
                cells.append(f"{min(f.completed for f in runs):.1%}")
                rows.append("| " + " | ".join(cells) + " |")
                print(rows[-1], flush=True)
    return rows, capacity.rps, trace_rps, len(trace)


def live_table(args: argparse.Namespace) -> str:
    """The live phase's Markdown: command, set-up, and per passthrough and tenant the live
    and simulated p99s."""
    rows, notes = run_live(
        args, trace_path=TRACE, mix=MIX, model=MODEL, preset_name=PRESET, tenants=TENANTS
    )
    command = (
        f"python benchmarks/bench_priority_passthrough.py --live --seed {args.seed} "
        f"--rho {args.rho:g} --duration-s {args.duration_s:g} --write docs/POLICIES.md"
    )
    return "\n".join([
        f"Command: `{command}` (trace `data/traces/{TRACE.name}`, mix `{MIX}`; "
        f"`sluicegate emulate --preset {PRESET} --max-num-seqs {MAX_NUM_SEQS} "
        "--scheduling-policy priority`, fresh per run, behind `sluicegate serve` with "
        "`max_inflight_tokens: off` and 1024 slots; simulated: the same configuration and "
        "requests). " + " ".join(notes) + " p99s in seconds: live from the request's "
        "launch, simulated from its arrival.",
        "",
        "| passthrough | tenant | live ok | live TTFT p99 | sim TTFT p99 | live/sim "
        "| live e2e p99 | sim e2e p99 | live/sim |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
        *rows,
    ])  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    """Simulate every set-up, load and seed (or, with ``--live``, run the live phase);
    print (or write) the Markdown table."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--seeds", type=int, default=5, help="seeds 0 … N−1")
    parser.add_argument("--live", action="store_true", help="the live phase instead")
    parser.add_argument("--seed", type=int, default=0, help="--live: seed of the tenant mix")
    parser.add_argument("--rho", type=float, default=0.9, help="--live: offered ÷ capacity")
    parser.add_argument("--duration-s", type=float, default=50.0, help="--live: arrivals span")
    parser.add_argument("--write", type=Path, default=None, help="Markdown file to update")
    args = parser.parse_args(argv)
    if args.live:
        table = live_table(args)
        print(table)
        if args.write is not None:
            write_section(args.write, "priority_passthrough_live", table)
        return 0
    rows, capacity, trace_rps, requests = run(args)
    command = "python benchmarks/bench_priority_passthrough.py"
    if args.seeds != 5:
        command += f" --seeds {args.seeds}"
    table = "\n".join([
        f"Command: `{command} --write docs/POLICIES.md` (trace "
        f"`data/traces/{TRACE.name}`, first {WINDOW_S / 60:g} minutes, "
        f"{requests} requests; mix `{MIX}`; preset `{PRESET}`, one replica; "
        f"capacity of `engine queues` without passthrough {capacity:.2f} req/s, so ρ 1 "
        f"replays the trace at ×{capacity / trace_rps:.2f}). p99s in seconds from arrival, "
        f"completed requests; median over seeds 0–{args.seeds - 1} (range).",
        "",
        "| set-up | ρ | passthrough | chat TTFT p99 | chat e2e p99 | background TTFT p99 "
        "| background e2e p99 | KV preemptions | completed |",
        "|---|---:|---|---:|---:|---:|---:|---:|---:|",
        *rows,
    ])  # fmt: skip
    print(table)
    if args.write is not None:
        write_section(args.write, "priority_passthrough", table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
