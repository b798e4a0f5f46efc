"""The policy table of docs/POLICIES.md, from the shipped Azure conversation trace.

Replays 20 minutes of the Azure LLM inference trace (conversation service)
through the real scheduler and one emulated Llama-3.1-8B/H100 replica, with
70% of requests from an interactive ``chat`` tenant (deadline 10 s) and 30%
from a ``docs`` tenant (deadline 120 s) in one shared lane, at several
multiples of the trace's rate, for each policy; writes the chat tenant's
latency table into docs/POLICIES.md.

    python benchmarks/policy_table.py [--write docs/POLICIES.md]
"""

from __future__ import annotations

import argparse
from pathlib import Path

from rich.console import Console

from mdsection import write_section
from sluicegate.config import load_config
from sluicegate.sim.run import run_comparison
from sluicegate.sim.workloads import apply_mix, load_workload, parse_mix, window

ROOT = Path(__file__).resolve().parents[1]
TRACE = ROOT / "data" / "traces" / "AzureLLMInferenceTrace_conv.csv"
CONFIG = ROOT / "examples" / "simulate-shared-lane.yaml"
MIX = "0.7:chat:shared:1:10000,0.3:docs:shared:3:120000"
POLICIES = ["fifo", "sjf", "oracle", "slack", "slack-oracle", "fair"]
LOADS = [2.0, 2.5, 3.0]


def _fmt(value: float | None, unit: str = "") -> str:
    return "—" if value is None else f"{value:.2f}{unit}"


def main(argv: list[str] | None = None) -> int:
    """Run the comparison and print (or write) the Markdown table."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--write", type=Path, default=None)
    parser.add_argument("--out", type=Path, default=Path("sim-out/policies"))
    args = parser.parse_args(argv)
    requests = apply_mix(
        window(load_workload(TRACE, max_tokens="pow2"), 0.0, 1200.0), parse_mix(MIX), seed=0
    )
    result = run_comparison(
        load_config(CONFIG, simulation=True), requests, POLICIES, out_dir=args.out, sweep=LOADS,
        console=Console(stderr=True),
    )  # fmt: skip
    rows = [
        "| load | policy | chat TTFT p99 (s) | chat e2e mean (s) | chat e2e p99 (s) "
        "| chat SLO met | docs e2e p99 (s) | docs SLO met |",
        "|---:|---|---:|---:|---:|---:|---:|---:|",
    ]
    order = {policy: i for i, policy in enumerate(POLICIES)}
    ordered = sorted(result.sweep, key=lambda s: (s.rate_multiplier, order[s.label.split(" ×")[0]]))
    for summary in ordered:
        chat, docs = summary.tenants["chat"], summary.tenants["docs"]
        policy = summary.label.split(" ×")[0]
        rows.append(
            f"| ×{summary.rate_multiplier:g} ({summary.offered_rps:.1f} req/s) | {policy} "
            f"| {_fmt(chat.ttft.p99)} | {_fmt(chat.e2e.mean)} | {_fmt(chat.e2e.p99)} "
            f"| {_fmt(100 * (chat.slo_attainment or 0), '%')} | {_fmt(docs.e2e.p99)} "
            f"| {_fmt(100 * (docs.slo_attainment or 0), '%')} |"
        )
    table = "\n".join(
        [
            "Command: `python benchmarks/policy_table.py --write docs/POLICIES.md` "
            "(trace: `data/traces/AzureLLMInferenceTrace_conv.csv`, first 20 minutes; "
            f"config: `examples/simulate-shared-lane.yaml`; mix `{MIX}`; "
            "client `max_tokens` = output rounded up to a power of two).",
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
