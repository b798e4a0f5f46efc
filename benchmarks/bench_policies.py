"""Policies, live: a trace slice through the gateway in real time, next to the simulator.

A slice of the Azure conversation trace (``data/traces``), replayed at
``--rate-scale`` × its rate, with 70% of requests from an interactive ``chat``
tenant (deadline 10 s, priority 1) and 30% from ``docs`` (deadline 120 s,
priority 3) in one shared lane of ``SLOTS`` slots, the mix of
``policy_table.py``. For each policy (``fifo``, then ``slack``) a fresh gateway
in front of one emulated Llama-3.1-8B/H100 replica (``sluicegate emulate``: the
engine model in real time; the same one for both, idle between runs) receives
the slice open-loop (streams, ``ignore_eos`` so each answer is exactly the
trace's output length; completions endpoint, so the gateway's prompt estimate
is the trace's prompt length); then
``sluicegate.sim.virtual_driver.simulate`` replays the same requests through the same
scheduler configuration and engine model under a virtual clock.

Table: per policy and tenant, live and simulated p99 end-to-end latency and time
to first token, and live / simulated. Bar: chat e2e p99 agree within 15%.

    python benchmarks/bench_policies.py [--full | --smoke] [--write docs/BENCHMARKS.md]
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import math
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from livestack import (
    CpuMeter,
    LiveStack,
    Process,
    live_stack,
    wide_console,
    write_report,
)
from sluicegate.bench.loadgen import run_load
from sluicegate.bench.records import RequestRecord
from sluicegate.config import parse_config
from sluicegate.engine.presets import preset
from sluicegate.outcomes import WorkloadRequest
from sluicegate.sim.comparison import with_policy
from sluicegate.sim.result import SimResult
from sluicegate.sim.virtual_driver import simulate
from sluicegate.sim.workloads import apply_mix, load_workload, parse_mix, scale_rate, window
from tables import Grid, bar_row, bars_grid, cells

ROOT = Path(__file__).resolve().parents[1]
TRACE = ROOT / "data" / "traces" / "AzureLLMInferenceTrace_conv.csv"
MODEL = "policy-llm"
PRESET = "llama-3.1-8b-h100"
SLOTS = 16
MIX = "0.7:chat:shared:1:10000,0.3:docs:shared:3:120000"
TENANTS = ("chat", "docs")
POLICIES = ("fifo", "slack")
BAR_AGREEMENT = 0.15
SCRAPE_S = 1.0
MODES = {
    "smoke": {"window_s": 4.0, "rate_scale": 2.0, "max_output": 48},
    "quick": {"window_s": 35.0, "rate_scale": 2.0, "max_output": 0},
    "full": {"window_s": 150.0, "rate_scale": 1.5, "max_output": 0},
}


def config_text(policy: str, engine_url: str) -> str:
    """The gateway's and the simulator's configuration: one shared lane of ``SLOTS``."""
    return f"""\
models:
  - name: {MODEL}
    backends: [{{name: e0, url: "{engine_url}", engine: emulator}}]
    max_concurrency: {SLOTS}
    lanes:
      - {{name: shared, max_concurrency: {SLOTS}, max_queue: 100000, queue_timeout_s: 3600,
          slo_ms: 60000, policy: {policy}, preemptible: never}}
simulation: {{preset: {PRESET}, replicas: 1, scrape_interval_s: {SCRAPE_S:g}}}
"""


def workload(args: argparse.Namespace) -> list[WorkloadRequest]:
    """The slice: ``window_s`` seconds of arrivals at ``rate_scale`` × the trace's rate."""
    span = args.window_s * args.rate_scale
    requests = scale_rate(window(load_workload(TRACE), args.start_s, span), args.rate_scale)
    if args.max_output:
        cap = args.max_output
        requests = [
            dataclasses.replace(r, output_tokens=min(r.output_tokens, cap), max_tokens=cap)
            if r.output_tokens > cap
            else r
            for r in requests
        ]
    return apply_mix(requests, parse_mix(MIX), seed=args.seed)


def live(
    stack: LiveStack, engine: Process, requests: list[WorkloadRequest], policy: str
) -> tuple[list[RequestRecord], float]:
    """Replay ``requests`` through a fresh gateway in front of the (idle) engine; the
    records and the cores other processes kept busy meanwhile."""
    gateway = stack.gateway(config_text(policy, engine.url), server={"scrape_interval_s": SCRAPE_S})
    meter = CpuMeter([engine, gateway])
    result = asyncio.run(
        run_load(
            requests, base_url=gateway.url, model=MODEL, api_keys={}, endpoint="completions",
            timeout_s=600.0,
        )
    )  # fmt: skip
    others = meter.others_cores()
    stack.stop(gateway)
    return list(result.records), others


def simulated(requests: list[WorkloadRequest], policy: str) -> SimResult:
    """The simulator's run of the same requests on the same configuration."""
    config = parse_config(config_text(policy, "http://127.0.0.1:9"))
    spec = with_policy(config.scheduler_spec(), MODEL, policy)
    return simulate(spec, MODEL, requests, preset(PRESET), 1, seed=0, scrape_interval_s=SCRAPE_S)


# ------------------------------------------------------------------ analysis

Figures = dict[str, list[float]]
"""Per metric (``e2e``, ``ttft``) the values of one tenant's successful requests, seconds."""


def live_figures(records: Sequence[RequestRecord], tenant: str) -> Figures:
    """End-to-end and first-token latencies of ``tenant``'s successful live requests."""
    ok = [r for r in records if r.ok and r.tenant == tenant]
    return {"e2e": [r.e2e_s for r in ok], "ttft": [r.ttft_s for r in ok if r.ttft_s is not None]}


def sim_figures(result: SimResult, tenant: str) -> Figures:
    """The same for the simulated run (completed requests)."""
    done = [
        r
        for r in result.records
        if r.tenant == tenant and r.outcome == "completed" and r.finish_s is not None
    ]
    return {
        "e2e": [r.finish_s - r.arrival_s for r in done if r.finish_s is not None],
        "ttft": [r.first_token_s - r.arrival_s for r in done if r.first_token_s is not None],
    }


def p99(values: Sequence[float]) -> float:
    """99th percentile in seconds; NaN if empty."""
    return float(np.percentile(np.asarray(values), 99)) if values else math.nan


def mean(values: Sequence[float]) -> float:
    """Mean in seconds; NaN if empty."""
    return float(np.mean(values)) if values else math.nan


def _s(value: float) -> str:
    return "—" if math.isnan(value) else f"{value:.2f}"


def _ratio(a: float, b: float) -> str:
    return "—" if math.isnan(a) or math.isnan(b) or b == 0 else f"{a / b:.2f}"


def comparison(
    runs: dict[str, tuple[list[RequestRecord], SimResult]],
) -> tuple[Grid, dict[str, float]]:
    """Live vs simulated, per policy and tenant; returns the table and chat e2e p99 live/sim."""
    headers = cells(
        "policy|tenant|requests|live ok|live e2e p99 s|sim e2e p99 s|live/sim|"
        "live TTFT p99 s|sim TTFT p99 s|live/sim|live e2e mean s|sim e2e mean s|live/sim"
    )
    rows, chat = [], {}
    for policy, (records, sim) in runs.items():
        for tenant in TENANTS:
            a, b = live_figures(records, tenant), sim_figures(sim, tenant)
            n = sum(1 for r in records if r.tenant == tenant)
            pairs = [(p99(a["e2e"]), p99(b["e2e"])), (p99(a["ttft"]), p99(b["ttft"]))]
            pairs.append((mean(a["e2e"]), mean(b["e2e"])))
            row = [policy, tenant, str(n), str(len(a["e2e"]))]
            for x, y in pairs:
                row += [_s(x), _s(y), _ratio(x, y)]
            rows.append(row)
            if tenant == "chat":
                chat[policy] = pairs[0][0] / pairs[0][1] if pairs[0][1] else math.nan
    return ("Live vs simulated, per policy and tenant", headers, rows), chat


def effect(runs: dict[str, tuple[list[RequestRecord], SimResult]]) -> Grid:
    """What ``slack`` does to chat's p99 relative to ``fifo``, live and simulated."""
    get: list[tuple[str, Callable[[str], float]]] = [
        ("live", lambda pol: p99(live_figures(runs[pol][0], "chat")["e2e"])),
        ("simulated", lambda pol: p99(sim_figures(runs[pol][1], "chat")["e2e"])),
    ]
    rows = []
    for label, f in get:
        fifo, slack = f("fifo"), f("slack")
        rows.append([label, _s(fifo), _s(slack), _ratio(slack, fifo)])
    headers = ["run", "fifo chat e2e p99 s", "slack chat e2e p99 s", "slack / fifo"]
    return "Effect of the policy on chat", headers, rows


def bars(chat: dict[str, float]) -> Grid:
    """Live and simulated chat p99 agree within ``BAR_AGREEMENT``."""
    rows = [
        bar_row(
            f"{policy}: chat e2e p99, live off sim by",
            abs(ratio - 1.0) * 100, BAR_AGREEMENT * 100, "%", upper=True,
        )
        for policy, ratio in chat.items()
    ]  # fmt: skip
    return bars_grid(rows, "Live vs simulator agreement (issue: policies)")


# ---------------------------------------------------------------------- main


def arguments(argv: list[str] | None) -> argparse.Namespace:
    """Parse the command line; ``--full``/``--smoke`` pick the slice (default: quick)."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--full", action="store_true", help="a longer slice (about 6 minutes)")
    mode.add_argument("--smoke", action="store_true", help="a few seconds, short outputs")
    parser.add_argument("--window-s", type=float, default=None, help="seconds of replay")
    parser.add_argument("--rate-scale", type=float, default=None, help="× the trace's rate")
    parser.add_argument("--max-output", type=int, default=None, help="cap outputs (0: none)")
    parser.add_argument("--start-s", type=float, default=0.0, help="where the slice starts")
    parser.add_argument("--seed", type=int, default=0, help="seed of the tenant mix")
    parser.add_argument("--write", type=Path, default=None, help="Markdown file to update")
    args = parser.parse_args(argv)
    args.mode = "full" if args.full else "smoke" if args.smoke else "quick"
    for name, value in MODES[args.mode].items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    return args


def main(argv: list[str] | None = None) -> int:
    """Run both policies live and simulated; print and optionally write the comparison."""
    args = arguments(argv)
    out = wide_console()
    requests = workload(args)
    runs: dict[str, tuple[list[RequestRecord], SimResult]] = {}
    others: dict[str, float] = {}
    with live_stack(out, "sluicegate-policies-") as stack:
        engine = stack.engine(MODEL, PRESET)
        for policy in POLICIES:
            with out.status(f"{policy}: {len(requests)} requests live…"):
                records, others[policy] = live(stack, engine, requests, policy)
            runs[policy] = (records, simulated(requests, policy))
            errors = sum(1 for r in records if not r.ok)
            out.print(
                f"{policy}: live done, {errors} failed; background {others[policy]:.2f} cores"
            )
    table, chat = comparison(runs)
    end = max(r.arrival_s for r in requests)
    busy = ", ".join(f"{p} {c:.2f}" for p, c in others.items())
    window = "first" if args.start_s == 0 else f"from {args.start_s:g} s,"
    notes = [
        f"Mode: {args.mode}. Trace: `data/traces/{TRACE.name}`, {window} "
        f"{args.window_s * args.rate_scale:g} s replayed at ×{args.rate_scale:g} over "
        f"{end:.0f} s: {len(requests)} requests "
        f"({len(requests) / args.window_s:.1f} req/s), mix `{MIX}`"
        + (f", outputs capped at {args.max_output} tokens" if args.max_output else "")
        + ".",
        f"Engine: emulator preset `{PRESET}`, one replica; one lane `shared` of {SLOTS} slots, "
        "no queue cap; client max_tokens = the trace's output, `ignore_eos`, streamed. "
        "Simulator: the same config and requests, `sluicegate.sim.virtual_driver.simulate`.",
        f"Background load (cores busy with processes not ours, per live run): {busy}.",
    ]
    write_report(
        args, script="bench_policies.py", section="bench_policies",
        title="Policies live: gateway + emulated replica vs the simulator", notes=notes,
        grids=[bars(chat), table, effect(runs)], argv=argv, out=out,
    )  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
