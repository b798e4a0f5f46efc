"""Sizing the batch for the interactive SLO, on the Azure conversation workload.

Replays 20 minutes of the Azure LLM inference trace (conversation service)
through the real scheduler and one emulated Llama-3.1-8B/H100 replica, 70% of
requests from an interactive ``chat`` tenant (deadline 10 s) and 30% from a
``docs`` tenant (deadline 120 s), and prints Markdown tables:

1. the engine model's decode step (= every running request's time per output
   token) against the batch size, and the capacity of the shared-lane config
   at each slot cap (``measure_capacity``);
2. unloaded (ρ ≈ 0.2, fifo, shared lane), ρ 0.9 fifo and slack (shared lane)
   and ρ 0.9 with ``examples/simulate-slo.yaml`` (two lanes and the ``slo``
   limit): chat TTFT p99, chat e2e p99 and its ratio to unloaded, chat TPOT
   mean, docs within 120 s.

ρ is offered rate ÷ the capacity of the shared-lane config (one reference for
every row, so all rows see the same arrivals).

    python benchmarks/slo_batch.py [--also 0.5 0.6 0.7]

With ``--also``, each further ρ adds a fifo and an slo row (ratios still to
the ρ 0.9 fifo row and the unloaded row).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from dataclasses import dataclass
from pathlib import Path

from mdsection import write_section
from sluicegate.config import Config, load_config
from sluicegate.engine import preset
from sluicegate.outcomes.record import RequestOutcome
from sluicegate.outcomes.request import WorkloadRequest
from sluicegate.sim.capacity import measure_capacity
from sluicegate.sim.comparison import run_comparison, scale_arrivals
from sluicegate.sim.workloads import apply_mix, load_workload, parse_mix, window

ROOT = Path(__file__).resolve().parents[1]
TRACE = ROOT / "data" / "traces" / "AzureLLMInferenceTrace_conv.csv"
SHARED = ROOT / "examples" / "simulate-shared-lane.yaml"
SLO = ROOT / "examples" / "simulate-slo.yaml"
SHARED_MIX = "0.7:chat:shared:1:10000,0.3:docs:shared:3:120000"
SLO_MIX = "0.7:chat:chat:1:10000,0.3:docs:docs:3:120000"
MODEL = "llama-3.1-8b"
CAPS = [16, 24, 32, 40, 48, 64, 96]
BATCHES = [1, 8, 16, 24, 32, 48, 64, 96]
CONTEXT_TOKENS = 1400
"""Mean context of a decoding request in this workload: 1,150 prompt + half of ~250 output."""


@dataclass(frozen=True, slots=True)
class Row:
    """One scenario's chat and docs figures."""

    name: str
    command: str
    load: float
    chat_ttft_p99: float
    chat_e2e_p99: float
    chat_tpot_mean_ms: float
    docs_within: float


def _workload(mix: str) -> list[WorkloadRequest]:
    trace = window(load_workload(TRACE, max_tokens="pow2"), 0.0, 1200.0)
    return apply_mix(trace, parse_mix(mix), seed=0)


def _rate(workload: list[WorkloadRequest]) -> float:
    span = workload[-1].arrival_s - workload[0].arrival_s
    return (len(workload) - 1) / span


def _capacity(config: Config, workload: list[WorkloadRequest]) -> float:
    engine = preset(config.simulation.preset)
    found = measure_capacity(
        config.scheduler_spec(), MODEL, workload, engine, config.simulation.replicas
    )
    if found is None:
        raise SystemExit("capacity could not be measured")
    return found.rps


def _shared_with_cap(cap: int) -> Config:
    text = SHARED.read_text().replace("max_concurrency: 48", f"max_concurrency: {cap}")
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as handle:
        handle.write(text)
    try:
        return load_config(Path(handle.name), simulation=True)
    finally:
        Path(handle.name).unlink()


def _tpot_s(record: RequestOutcome) -> float | None:
    if record.first_token_s is None or record.finish_s is None or record.generated_tokens < 2:
        return None
    return (record.finish_s - record.first_token_s) / (record.generated_tokens - 1)


def _scenario(
    name: str, config_path: Path, mix: str, policy: str, k: float, rate_rps: float, out: Path
) -> Row:
    workload = scale_arrivals(_workload(mix), k)
    result = run_comparison(
        load_config(config_path, simulation=True), workload, [policy], out_dir=out / name,
        workers=1,
    )  # fmt: skip
    summary = result.summaries[0]
    chat, docs = summary.tenants["chat"], summary.tenants["docs"]
    chat_records = [r for r in result.results[policy].records if r.tenant == "chat"]
    tpots = [t for t in map(_tpot_s, chat_records) if t is not None]
    command = (
        f"sluicegate simulate --config {config_path.relative_to(ROOT)} --trace "
        f"{TRACE.relative_to(ROOT)} --window 0:1200 --max-tokens pow2 --mix '{mix}' "
        f"--rate-scale {k:.4f} --policy {policy}"
    )
    return Row(
        name,
        command,
        summary.offered_rps / rate_rps,
        chat.ttft.p99 or 0.0,
        chat.e2e.p99 or 0.0,
        1e3 * statistics.fmean(tpots),
        100.0 * (docs.slo_attainment or 0.0),
    )


def _engine_table(shared_capacity: dict[int, float]) -> list[str]:
    cfg = preset("llama-3.1-8b-h100")
    lines = [
        f"Decode step of `llama-3.1-8b-h100` (context {CONTEXT_TOKENS} tokens per sequence, "
        "no prefill in the step):",
        "",
        "| batch | step = TPOT (ms) | decode tok/s |",
        "|---:|---:|---:|",
    ]
    for batch in BATCHES:
        step = cfg.step_s(0, batch, batch * CONTEXT_TOKENS)
        lines.append(f"| {batch} | {1e3 * step:.2f} | {batch / step:,.0f} |")
    lines += [
        "",
        "Capacity of `examples/simulate-shared-lane.yaml` at each slot cap (`measure_capacity`):",
        "",
        "| slot cap | capacity (req/s) |",
        "|---:|---:|",
        *(f"| {cap} | {rps:.2f} |" for cap, rps in shared_capacity.items()),
    ]
    return lines


def main(argv: list[str] | None = None) -> int:
    """Measure and print the tables."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("sim-out/slo-batch"))
    parser.add_argument("--write", type=Path, default=None, help="Markdown file to update")
    parser.add_argument("--load", type=float, default=0.9, help="ρ of the loaded rows")
    parser.add_argument(
        "--also",
        type=float,
        nargs="*",
        default=[],
        help="further ρ values: a fifo (shared lane) and an slo row for each",
    )
    args = parser.parse_args(argv)
    base = _workload(SHARED_MIX)
    capacities = {cap: _capacity(_shared_with_cap(cap), base) for cap in CAPS}
    reference = capacities[48]
    rate = _rate(base)
    k_loaded = args.load * reference / rate
    k_unloaded = 0.2 * reference / rate
    rows = [
        _scenario("unloaded", SHARED, SHARED_MIX, "fifo", k_unloaded, reference, args.out),
        _scenario("fifo", SHARED, SHARED_MIX, "fifo", k_loaded, reference, args.out),
        _scenario("slack", SHARED, SHARED_MIX, "slack", k_loaded, reference, args.out),
        _scenario("slo", SLO, SLO_MIX, "config", k_loaded, reference, args.out),
    ]
    for rho in args.also:
        k = rho * reference / rate
        rows.append(
            _scenario(f"fifo ρ {rho:g}", SHARED, SHARED_MIX, "fifo", k, reference, args.out)
        )
        rows.append(_scenario(f"slo ρ {rho:g}", SLO, SLO_MIX, "config", k, reference, args.out))
    unloaded, fifo = rows[0], rows[1]
    lines = [
        *_engine_table(capacities),
        "",
        f"ρ = offered ÷ {reference:.2f} req/s (the shared-lane config's capacity at 48 slots).",
        "",
        "| run | ρ | chat TTFT p99 (s) | ÷ fifo | chat e2e p99 (s) | ÷ unloaded "
        "| chat TPOT mean (ms) | docs within 120 s |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        lines.append(
            f"| {row.name} | {row.load:.2f} | {row.chat_ttft_p99:.3f} "
            f"| {row.chat_ttft_p99 / fifo.chat_ttft_p99:.2f}× | {row.chat_e2e_p99:.2f} "
            f"| {row.chat_e2e_p99 / unloaded.chat_e2e_p99:.2f}× | {row.chat_tpot_mean_ms:.2f} "
            f"| {row.docs_within:.1f}% |"
        )
    lines += ["", "Commands:", "", *(f"- {row.name}: `{row.command}`" for row in rows)]
    text = "\n".join(
        ["Command: `python benchmarks/slo_batch.py --write docs/POLICIES.md`.", "", *lines]
    )
    print(text)
    if args.write is not None:
        write_section(args.write, "slo_batch", text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
