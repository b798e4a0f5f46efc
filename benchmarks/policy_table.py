"""The policy table of docs/POLICIES.md, from the shipped Azure conversation trace.

Replays 20 minutes of the Azure LLM inference trace (conversation service)
through the real scheduler and one emulated Llama-3.1-8B/H100 replica, with
70% of requests from an interactive ``chat`` tenant (deadline 10 s) and 30%
from a ``docs`` tenant (deadline 120 s), at offered loads ρ = offered rate ÷
measured capacity (``sim/capacity.py``: completions per second under backlog
of the one-lane configuration on this workload). Two set-ups at the same
offered rates: one shared lane under each policy
(``examples/simulate-shared-lane.yaml``), the same lane with ``slack`` and
``shed_hopeless`` (``examples/simulate-shed-hopeless.yaml``), and chat and docs in
lanes of their own, both shedding (``examples/simulate-two-lanes.yaml``). Writes
the Markdown table into docs/POLICIES.md.

    python benchmarks/policy_table.py [--write docs/POLICIES.md]
"""

from __future__ import annotations

import argparse
from pathlib import Path

from rich.console import Console

from mdsection import write_section
from sluicegate.config import load_config
from sluicegate.engine.presets import preset
from sluicegate.sim.capacity import measure_capacity
from sluicegate.sim.comparison import run_comparison
from sluicegate.sim.run_summary import Summary
from sluicegate.sim.workloads import apply_mix, load_workload, parse_mix, window

ROOT = Path(__file__).resolve().parents[1]
TRACE = ROOT / "data" / "traces" / "AzureLLMInferenceTrace_conv.csv"
SHARED = ROOT / "examples" / "simulate-shared-lane.yaml"
SHEDDING = ROOT / "examples" / "simulate-shed-hopeless.yaml"
TWO_LANES = ROOT / "examples" / "simulate-two-lanes.yaml"
SHARED_MIX = "0.7:chat:shared:1:10000,0.3:docs:shared:3:120000"
TWO_LANE_MIX = "0.7:chat:chat:1:10000,0.3:docs:docs:3:120000"
POLICIES = ["fifo", "sjf", "slack", "slack-oracle", "fair"]
LOADS = [0.8, 0.9, 1.0, 2.0]
WINDOW_S = 1200.0


def _fmt(value: float | None, unit: str = "") -> str:
    return "—" if value is None else f"{value:.2f}{unit}"


def _pct(value: float | None) -> str:
    return "—" if value is None else f"{100 * value:.1f}%"


def _row(summary: Summary, rho: float, setup: str) -> str:
    chat, docs = summary.tenants["chat"], summary.tenants["docs"]
    return (
        f"| {rho:g} ({summary.offered_rps:.1f} req/s) | {setup} | {_fmt(chat.ttft.p99)} "
        f"| {_fmt(chat.e2e.p99)} | {_pct(chat.slo_attainment)} | {_fmt(docs.e2e.p99)} "
        f"| {_pct(docs.slo_attainment)} |"
    )


def main(argv: list[str] | None = None) -> int:
    """Run both set-ups at every load and print (or write) the Markdown table."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--write", type=Path, default=None)
    parser.add_argument("--out", type=Path, default=Path("sim-out/policies"))
    args = parser.parse_args(argv)
    console = Console(stderr=True)
    trace = window(load_workload(TRACE, max_tokens="pow2"), 0.0, WINDOW_S)
    shared_config = load_config(SHARED, simulation=True)
    shared = apply_mix(trace, parse_mix(SHARED_MIX), seed=0)
    two_lanes = apply_mix(trace, parse_mix(TWO_LANE_MIX), seed=0)
    model = shared_config.models[0].name
    engine = preset(shared_config.simulation.preset)
    capacity = measure_capacity(
        shared_config.scheduler_spec(), model, shared, engine, shared_config.simulation.replicas
    )
    if capacity is None:
        raise SystemExit("capacity could not be measured")
    trace_rps = len(trace) / WINDOW_S
    multipliers = {rho: rho * capacity.rps / trace_rps for rho in LOADS}
    one = run_comparison(
        shared_config, shared, POLICIES, out_dir=args.out / "shared",
        sweep=list(multipliers.values()), console=console,
    )  # fmt: skip
    shedding = run_comparison(
        load_config(SHEDDING, simulation=True), shared, ["config"],
        out_dir=args.out / "shed-hopeless", sweep=list(multipliers.values()), console=console,
    )  # fmt: skip
    two = run_comparison(
        load_config(TWO_LANES, simulation=True), two_lanes, ["config"],
        out_dir=args.out / "two-lanes", sweep=list(multipliers.values()), console=console,
    )  # fmt: skip
    rows = [
        "| ρ (offered) | set-up | chat TTFT p99 (s) | chat e2e p99 (s) | chat goodput "
        "| docs e2e p99 (s) | docs goodput |",
        "|---:|---|---:|---:|---:|---:|---:|",
    ]
    for rho, k in multipliers.items():
        for summary in one.sweep:
            if summary.rate_multiplier == k:
                rows.append(_row(summary, rho, f"one lane, `{summary.label.split(' ×')[0]}`"))
        for summary in shedding.sweep:
            if summary.rate_multiplier == k:
                rows.append(_row(summary, rho, "one lane, `slack` + `shed_hopeless`"))
        for summary in two.sweep:
            if summary.rate_multiplier == k:
                rows.append(_row(summary, rho, "two lanes, `slack` + `shed_hopeless` each"))
    table = "\n".join(
        [
            "Command: `python benchmarks/policy_table.py --write docs/POLICIES.md` "
            "(trace: `data/traces/AzureLLMInferenceTrace_conv.csv`, first 20 minutes; "
            f"one lane: `examples/simulate-shared-lane.yaml` (with `shed_hopeless`: "
            f"`examples/simulate-shed-hopeless.yaml`), mix `{SHARED_MIX}`; "
            f"two lanes: `examples/simulate-two-lanes.yaml`, mix `{TWO_LANE_MIX}`; "
            "client `max_tokens` = output rounded up to a power of two). "
            f"Capacity of the one-lane set-up on this workload: {capacity.rps:.2f} req/s "
            f"(completions per second under backlog); ρ = offered ÷ capacity. "
            "Goodput = requests completed within their deadline ÷ requests offered.",
            "",
            *rows,
        ]
    )
    print(table)
    if args.write is not None:
        write_section(args.write, "policy_table", table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
