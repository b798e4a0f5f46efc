"""Fidelity: the simulator against a real engine, cell by cell (issue 32).

The same trace slices run live — the gateway in front of 1 or 2 llama-server replicas,
each pinned to a core (``fidelity_live``), the load generator replaying the slice — and in
the simulator with a preset that ``sluicegate calibrate`` measured from the same engine
(or ``--preset``). Cells: replicas × loads (a fraction of the *measured* capacity of that
set-up: a live saturation run, as ``sim/capacity.py`` measures the simulated one) ×
gateway policies. Each cell compares TTFT, TPOT and end to end at p50/p90/p99 and output
throughput; the goal is a median absolute error ≤ 10% over all of them and none above 25%.

Workload: the Azure conversation trace (``data/traces``), lengths scaled to the model's
2,048-token slots (prompt ÷ 8 capped at 400 requested tokens, about 1,450 of the model's
byte-level tokens; output ≤ 256, sent with ``ignore_eos``), consecutive requests from the
trace's start, arrivals compressed to ``--duration-s`` at the cell's rate.

    python benchmarks/fidelity.py [--quick] [--preset FILE] [--write docs/BENCHMARKS.md]
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.realengine.tiny_gguf import write_tiny_gguf

from fidelity_live import (
    MODEL,
    SCRAPE_S,
    SHAPE,
    calibrate,
    config_text,
    engines,
    pin,
    replay,
    tokenized,
)
from fidelity_metrics import FIGURES, Latencies, errors, live_latencies, sim_latencies, summary
from livestack import live_stack, wide_console, write_report
from sluicegate.bench.records import RequestRecord
from sluicegate.calibrate.preset_file import load_engine_config
from sluicegate.config import parse_config
from sluicegate.engine.engine_config import EngineConfig
from sluicegate.outcomes import WorkloadRequest
from sluicegate.sim.capacity import saturation_sample, steady_rate
from sluicegate.sim.virtual_driver import simulate
from sluicegate.sim.workloads import load_workload
from tables import Grid

ROOT = Path(__file__).resolve().parents[1]
TRACE = ROOT / "data" / "traces" / "AzureLLMInferenceTrace_conv.csv"
PROMPT_DIV, MAX_PROMPT, MAX_OUTPUT = 8, 400, 256
POOL = 4000
SATURATION_PER_SLOT = 12
GOAL_MEDIAN, GOAL_MAX = 0.10, 0.25


def scaled_trace() -> list[WorkloadRequest]:
    """The trace with lengths scaled to the model, in lane ``shared``."""
    return [
        dataclasses.replace(
            r, prompt_tokens=max(1, min(MAX_PROMPT, round(r.prompt_tokens / PROMPT_DIV))),
            output_tokens=(out := max(1, min(MAX_OUTPUT, r.output_tokens))),
            max_tokens=out, lane="shared", tenant="default",
        )
        for r in load_workload(TRACE)[:POOL]
    ]  # fmt: skip


def spec_for(replicas: int, policy: str):  # type: ignore[no-untyped-def]
    """The scheduler spec the simulator runs (the gateway's config, placeholder URLs)."""
    urls = [f"http://127.0.0.1:{9 + i}" for i in range(replicas)]
    return parse_config(config_text(urls, policy)).scheduler_spec()


def simulated(
    requests: list[WorkloadRequest], engine: EngineConfig, replicas: int, policy: str
) -> Latencies:
    """The simulator's figures for ``requests`` on this set-up."""
    result = simulate(
        spec_for(replicas, policy), MODEL, requests, engine, replicas,
        seed=0, scrape_interval_s=SCRAPE_S,
    )  # fmt: skip
    return sim_latencies(result)


def verdict_of(label: str, errors: list[float]) -> str:
    """The goals (median ≤ 10%, none above 25%) against ``errors``: met or missed."""
    median, worst = summary(errors)
    return (
        f"{label}: median absolute error {100 * median:.1f}% over {len(errors)} figures "
        f"(goal ≤ {100 * GOAL_MEDIAN:.0f}%: {'met' if median <= GOAL_MEDIAN else 'missed'}), "
        f"largest {100 * worst:.1f}% (goal ≤ {100 * GOAL_MAX:.0f}%: "
        f"{'met' if worst <= GOAL_MAX else 'missed'}, "
        f"{sum(e > GOAL_MAX for e in errors)} figures above)."
    )


def shown(value: float) -> str:
    """A figure with the digits that matter: TPOTs are a few milliseconds."""
    return f"{value:.1f}" if value < 100 else f"{value:.0f}"


def finishes(records: list[RequestRecord]) -> list[float]:
    """When each successful live request ended, from the run's start."""
    return [r.scheduled_s + r.launch_lag_s + r.e2e_s for r in records if r.ok]


def compressed(
    pool: list[WorkloadRequest], rate: float, duration_s: float
) -> list[WorkloadRequest]:
    """The first ``rate × duration_s`` requests of ``pool``, arrivals scaled into ``duration_s``."""
    count = max(2, round(rate * duration_s))
    assert count <= len(pool), f"{count} requests wanted, more than the pool of {len(pool)}"
    picked = pool[:count]
    t0, span = picked[0].arrival_s, picked[-1].arrival_s - picked[0].arrival_s
    return [
        dataclasses.replace(r, arrival_s=(r.arrival_s - t0) * duration_s / span) for r in picked
    ]


def arguments(argv: list[str] | None) -> argparse.Namespace:
    """Parse the command line."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--replicas", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--loads", type=float, nargs="+", default=[0.3, 0.6, 0.9])
    parser.add_argument("--policies", nargs="+", default=["fifo", "slack"])
    parser.add_argument("--duration-s", type=float, default=60.0, help="seconds of arrivals")
    parser.add_argument("--preset", default=None, help="preset name or file (default: calibrate)")
    parser.add_argument("--repeats", type=int, default=3, help="calibration repeats")
    parser.add_argument("--quick", action="store_true", help="1 replica, load 0.6, 20 s")
    parser.add_argument("--out", type=Path, default=None, help="keep the preset and CSVs here")
    parser.add_argument("--write", type=Path, default=None, help="Markdown file to update")
    args = parser.parse_args(argv)
    if args.quick:
        args.replicas, args.loads, args.duration_s = [1], [0.6], 20.0
    return args


def main(argv: list[str] | None = None) -> int:
    """Calibrate, measure capacity per set-up, run every cell live and simulated, report."""
    args = arguments(argv)
    out = wide_console()
    pin(os.getpid(), {0})
    rows: list[list[str]] = []
    values: list[list[str]] = []
    all_errors: list[float] = []
    by_replicas: dict[str, list[float]] = {}
    notes: list[str] = []
    with tempfile.TemporaryDirectory(prefix="sluicegate-fidelity-") as tmp_name:
        tmp = Path(tmp_name)
        keep = args.out or tmp
        keep.mkdir(parents=True, exist_ok=True)
        model = write_tiny_gguf(tmp / "small.gguf", shape=SHAPE)
        with live_stack(out, "sluicegate-fidelity-") as stack:
            with engines(model, 1, tmp) as (server,):
                with out.status("tokenizing the trace's prompts…"):
                    pool = tokenized(server.url, scaled_trace())
                live_pool = scaled_trace()
                preset_path = Path(args.preset) if args.preset else keep / "calibrated.json"
                if args.preset is None:
                    gateway = stack.gateway(config_text([server.url], "fifo"))
                    try:
                        calibrate(gateway.url, preset_path, args.repeats)
                    finally:
                        stack.stop(gateway)
            engine = load_engine_config(str(preset_path))
            notes.append(f"Preset: `{args.preset or 'sluicegate calibrate'}` → {engine}.")
            for replicas in args.replicas:
                size = SATURATION_PER_SLOT * 4 * replicas
                sample_live = saturation_sample(live_pool, size)
                with engines(model, replicas, tmp) as servers, out.status("capacity…"):
                    sample_sim = tokenized(servers[0].url, sample_live)
                    records = replay(stack, servers, "fifo", sample_live)
                live_rate = steady_rate(finishes(records))
                assert live_rate is not None, "too few live completions to measure capacity"
                result = simulate(
                    spec_for(replicas, "fifo"), MODEL, sample_sim, engine, replicas,
                    seed=0, scrape_interval_s=SCRAPE_S,
                )  # fmt: skip
                sim_rate = steady_rate([r.finish_s for r in result.records if r.finish_s])
                assert sim_rate is not None
                capacity = live_rate[0]
                notes.append(
                    f"{replicas} replica(s): measured capacity {capacity:.2f} req/s live, "
                    f"{sim_rate[0]:.2f} simulated ({size} requests at once)."
                )
                for load in args.loads:
                    live_slice = compressed(live_pool, load * capacity, args.duration_s)
                    sim_slice = compressed(pool, load * capacity, args.duration_s)
                    for policy in args.policies:
                        with (
                            engines(model, replicas, tmp) as servers,
                            out.status(
                                f"{replicas} × llama-server, load {load:g}, {policy}: "
                                f"{len(live_slice)} requests…"
                            ),
                        ):
                            live = live_latencies(replay(stack, servers, policy, live_slice))
                        sim = simulated(sim_slice, engine, replicas, policy)
                        live_f, sim_f = live.figures(), sim.figures()
                        err = errors(live_f, sim_f)
                        all_errors += err.values()
                        by_replicas.setdefault(f"{replicas} replica(s)", []).extend(err.values())
                        label = [str(replicas), f"{load:g}", policy]
                        rows.append(label + [f"{100 * err[f]:.0f}%" for f in FIGURES])
                        values.append(
                            label + [f"{shown(live_f[f])} / {shown(sim_f[f])}" for f in FIGURES]
                        )
                        out.print(" ".join(rows[-1]) + f"  (failed live {live.failed})")
    verdict = " ".join(
        verdict_of(label, errors)
        for label, errors in [("All cells", all_errors), *sorted(by_replicas.items())]
    )
    head = ["replicas", "load", "policy", *FIGURES]
    grids: list[Grid] = [
        ("|simulated − live| ÷ live", head, rows),
        ("live / simulated (latencies ms, throughput tokens/s)", head, values),
    ]
    write_report(
        args, script="fidelity.py", section="fidelity", title="Fidelity: the simulator vs "
        "llama-server, live", notes=[*notes, verdict], grids=grids, argv=argv, out=out,
    )  # fmt: skip
    out.print(verdict)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
