"""Early shedding (`shed_hopeless`) in one shared `slack` lane: goodput per tenant.

The workload of issue 14: the Azure conversation trace (20 minutes, `max_tokens`
rounded up to a power of two) at 4.5× its rate, 30% `chat` requests with a 10 s
deadline and 70% `docs` requests with 120 s, all in one `slack` lane of 48 slots
in front of one emulated Llama-3.1-8B/H100 replica (about 2× capacity; chat
alone is about 0.6×). It runs `examples/simulate-shed-hopeless.yaml` as it is
and with `shed_hopeless` off, and prints per tenant: goodput (completed within
the deadline ÷ offered), shed, and completed late.

    python benchmarks/shed_goodput.py [--rate-scale 4.5] [--seed 0]
"""

from __future__ import annotations

import argparse
from pathlib import Path

from mdsection import write_section
from sluicegate.config import load_config
from sluicegate.core.spec import SchedulerSpec
from sluicegate.engine import preset
from sluicegate.outcomes import COMPLETED, WorkloadRequest
from sluicegate.sim.result import SimResult
from sluicegate.sim.virtual_driver import simulate
from sluicegate.sim.workload_options import WorkloadOptions, build_workload

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "examples" / "simulate-shed-hopeless.yaml"
TRACE = ROOT / "data" / "traces" / "AzureLLMInferenceTrace_conv.csv"
MIX = "0.3:chat:shared:1:10000,0.7:docs:shared:3:120000"
TENANTS = ("chat", "docs")


def without_shedding(spec: SchedulerSpec) -> SchedulerSpec:
    """``spec`` with ``shed_hopeless`` off in every lane."""
    models = tuple(
        model.model_copy(
            update={
                "lanes": tuple(
                    lane.model_copy(update={"shed_hopeless": False}) for lane in model.lanes
                )
            }
        )
        for model in spec.models
    )
    return spec.model_copy(update={"models": models})


def row(label: str, result: SimResult) -> list[str]:
    """The table row of one run: per tenant goodput, shed and late, then all met."""
    cells = [label]
    met_all = 0
    for tenant in TENANTS:
        records = [r for r in result.records if r.tenant == tenant]
        done = [r for r in records if r.outcome == COMPLETED]
        met = sum(1 for r in done if r.finish_s is not None and r.finish_s <= r.deadline_s)
        shed = sum(1 for r in records if r.outcome == "shed")
        met_all += met
        cells += [
            f"{met / max(1, len(records)):.1%} ({met}/{len(records)})",
            str(shed),
            str(len(done) - met),
        ]
    cells.append(str(met_all))
    return cells


def main() -> None:
    """Run with and without shedding and print the Markdown table."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rate-scale", type=float, default=4.5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--write", type=Path, default=None, help="Markdown file to update")
    args = parser.parse_args()
    config = load_config(CONFIG, simulation=True)
    options = WorkloadOptions(
        trace=TRACE,
        window=(0.0, 1200.0),
        rate_scale=args.rate_scale,
        mix=MIX,
        seed=args.seed,
        max_tokens="pow2",
    )
    requests: list[WorkloadRequest] = build_workload(options)
    spec = config.scheduler_spec()
    model = spec.models[0].name
    engine = preset(config.simulation.preset)
    replicas = config.simulation.replicas
    runs = (
        ("`slack`, `shed_hopeless: true`", spec),
        ("`slack`, no shedding", without_shedding(spec)),
    )
    header = ["setup"]
    for tenant in TENANTS:
        header += [f"{tenant} goodput", f"{tenant} shed", f"{tenant} late"]
    header.append("met deadline (all)")
    lines = ["| " + " | ".join(header) + " |", "|---|" + "---:|" * (len(header) - 1)]
    for label, run_spec in runs:
        result = simulate(run_spec, model, requests, engine, replicas, seed=args.seed)
        lines.append("| " + " | ".join(row(label, result)) + " |")
    command = (
        f"python benchmarks/shed_goodput.py --rate-scale {args.rate_scale:g} --seed {args.seed}"
    )
    text = f"`{command}` ({len(requests)} requests):\n\n" + "\n".join(lines)
    print(text)
    if args.write is not None:
        write_section(args.write, "shed_goodput", text)


if __name__ == "__main__":
    main()
