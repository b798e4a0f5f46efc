"""The noisy-neighbour measurement (issue 14): does a burst of one tenant hurt the other?

Two tenants share the ``shared`` lane of ``examples/simulate-noisy-neighbour.yaml``
(one emulated Llama-3.1-8B/H100 replica, 48 slots). ``quiet`` sends Poisson
3 req/s; ``noisy`` sends Poisson 3 req/s and, with bursts, 10× that rate for 20 s
of every 200 s. Lengths are drawn from the shipped Azure conversation trace. For
each set-up (lane policy, slot caps) the script simulates the workload without
and with the noisy tenant's bursts and prints the quiet tenant's end-to-end p99,
queue-wait p99 and time per output token (mean, p99), and the ratio of the e2e
p99s (the issue's goal: ≤ 1.2×). The same as, per run::

    sluicegate simulate --config examples/simulate-noisy-neighbour.yaml \\
      --tenant-load quiet:3:lane=shared \\
      --tenant-load noisy:3:lane=shared[:burst=10x20s/200s] --duration 1200 --policy POLICY

    python benchmarks/noisy_neighbour.py [--duration 1200] [--seed 0] [--smoke]

"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from mdsection import write_section
from sluicegate.config import load_config
from sluicegate.core.component_specs import AdaptiveSpec
from sluicegate.core.spec import SchedulerSpec
from sluicegate.engine.presets import preset
from sluicegate.outcomes.record import COMPLETED, RequestOutcome
from sluicegate.sim.comparison import policy_spec
from sluicegate.sim.virtual_driver import simulate
from sluicegate.sim.workloads import load_workload
from sluicegate.sim.workloads.tenants import parse_tenant_load, tenant_loads

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "examples" / "simulate-noisy-neighbour.yaml"
TRACE = ROOT / "data" / "traces" / "AzureLLMInferenceTrace_conv.csv"
QUIET = "quiet:3:lane=shared"
NOISY = "noisy:3:lane=shared"
BURST = ":burst=10x20s/200s"


@dataclass(frozen=True)
class Setup:
    """One row pair of the table: the lane's policy and preemption, caps, limit, weights."""

    label: str
    policy: str = "fair"
    slots: int = 48
    preemptible: str = "never"
    preempt_after_ms: float | None = None
    slo_tpot_ms: float | None = None
    quiet_weight: float = 1.0

    def spec(self, base: SchedulerSpec) -> SchedulerSpec:
        """``base`` (the example config) with this set-up applied to its one model."""
        spec = policy_spec(base, base.models[0].name, self.policy)
        model = spec.models[0]
        lane_update = {
            "max_concurrency": self.slots,
            "preemptible": self.preemptible,
            "preempt_after_ms": self.preempt_after_ms,
        }
        lanes = tuple(lane.model_copy(update=lane_update) for lane in model.lanes)
        adaptive = (
            None
            if self.slo_tpot_ms is None
            else AdaptiveSpec(mode="slo", tpot_ms=self.slo_tpot_ms, floor=8)
        )
        model = model.model_copy(
            update={"max_concurrency": self.slots, "lanes": lanes, "adaptive": adaptive}
        )
        tenants = tuple(
            t.model_copy(update={"weight": self.quiet_weight}) if t.name == "quiet" else t
            for t in spec.tenants
        )
        return spec.model_copy(update={"models": (model,), "tenants": tenants})


SETUPS = [
    Setup("fifo", policy="fifo"),
    Setup("fair, no engine share (`preemptible: never`; = fair before it)"),
    Setup("fair + engine share (`always`, requeue)", preemptible="always"),
    Setup("fair + engine share, 250 ms grace", preemptible="always", preempt_after_ms=250.0),
    Setup("fair, no share, 32 slots", slots=32),
    Setup("fair + share + grace, 32 slots", slots=32, preemptible="always", preempt_after_ms=250.0),
    Setup("fair, no share, 24 slots", slots=24),
    Setup("fair, no share, slo limit 13 ms", slo_tpot_ms=13.0),
    Setup("fair, no share, slo limit 13 ms, quiet weight 2", slo_tpot_ms=13.0, quiet_weight=2.0),
    Setup(
        "fair + share + grace, slo limit 13 ms",
        preemptible="always",
        preempt_after_ms=250.0,
        slo_tpot_ms=13.0,
    ),
    Setup(
        "fair + share + grace, slo limit 13 ms, quiet weight 2",
        preemptible="always",
        preempt_after_ms=250.0,
        slo_tpot_ms=13.0,
        quiet_weight=2.0,
    ),
]


def _quiet(records: Sequence[RequestOutcome]) -> tuple[float, float, float, float, float]:
    """The quiet tenant's e2e p99, queue-wait p99, TPOT mean and p99 (ms) over its completed
    requests, and the fraction of its requests that completed."""
    quiet = [r for r in records if r.tenant == "quiet"]
    done = [r for r in quiet if r.outcome == COMPLETED]
    e2e = [r.finish_s - r.arrival_s for r in done if r.finish_s is not None]
    waits = [r.admit_s - r.arrival_s for r in done if r.admit_s is not None]
    tpot = [
        (r.finish_s - r.first_token_s) / (r.output_tokens - 1) * 1000.0
        for r in done
        if r.finish_s is not None and r.first_token_s is not None and r.output_tokens > 1
    ]
    return (
        float(np.percentile(e2e, 99)),
        float(np.percentile(waits, 99)),
        float(np.mean(tpot)),
        float(np.percentile(tpot, 99)),
        len(done) / len(quiet),
    )


def main(argv: list[str] | None = None) -> int:
    """Simulate every set-up without and with bursts; print the Markdown table."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--duration", type=float, default=1200.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--smoke", action="store_true", help="120 s, two set-ups")
    parser.add_argument("--write", type=Path, default=None, help="Markdown file to update")
    args = parser.parse_args(argv)
    duration = 120.0 if args.smoke else args.duration
    config = load_config(CONFIG, simulation=True)
    engine = preset(config.simulation.preset)
    lengths = load_workload(TRACE)
    workloads = {
        bursts: tenant_loads(
            [parse_tenant_load(QUIET), parse_tenant_load(NOISY + (BURST if bursts else ""))],
            lengths,
            duration,
            seed=args.seed,
        )
        for bursts in (False, True)
    }
    rows = [
        "| set-up | bursts | quiet e2e p99 (s) | quiet queue wait p99 (s) "
        "| quiet TPOT mean (ms) | quiet TPOT p99 (ms) | quiet completed | noisy completed "
        "| e2e p99 ratio |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for setup in SETUPS[:2] if args.smoke else SETUPS:
        spec = setup.spec(config.scheduler_spec())
        base = 0.0
        for bursts, workload in workloads.items():
            result = simulate(spec, spec.models[0].name, workload, engine, 1, seed=args.seed)
            e2e, wait, tpot_mean, tpot_p99, completed = _quiet(result.records)
            noisy = [r for r in result.records if r.tenant == "noisy"]
            noisy_done = sum(r.outcome == COMPLETED for r in noisy) / len(noisy)
            ratio = "" if not bursts else f"×{e2e / base:.2f}"
            base = e2e
            rows.append(
                f"| {setup.label} | {'yes' if bursts else 'no'} | {e2e:.2f} | {wait:.2f} "
                f"| {tpot_mean:.1f} | {tpot_p99:.1f} | {completed:.1%} | {noisy_done:.1%} "
                f"| {ratio} |"
            )
    text = (
        f"Command: `python benchmarks/noisy_neighbour.py --duration {duration:g} "
        f"--seed {args.seed}` (tenants `{QUIET}` and `{NOISY}[{BURST}]`, "
        f"{duration:g} s, lengths from `data/traces/AzureLLMInferenceTrace_conv.csv`, "
        "`examples/simulate-noisy-neighbour.yaml` with the set-up's policy, lane and model "
        "slots, `preemptible`, `preempt_after_ms`, `adaptive: {mode: slo, tpot_ms, floor: 8}` "
        "and quiet's weight; preemptions requeue once, then abort). Latencies over the quiet "
        "tenant's completed requests; ratio: its e2e p99 with bursts ÷ without.\n\n"
        + "\n".join(rows)
    )
    print(text)
    if args.write is not None:
        write_section(args.write, "noisy_neighbour", text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
