"""The simulator report's load figures (offered, capacity, ρ, slot occupancy, KV usage)
and ``--policy config``, the default (sim/run_summary.py, sim/comparison.py; DESIGN §12)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from typer.testing import CliRunner

from sluicegate.cli import app
from sluicegate.config import Config, SimulationSpec, TenantConfig
from sluicegate.core.spec import LaneSpec, ModelSpec, SchedulerSpec
from sluicegate.engine.engine_config import EngineConfig
from sluicegate.outcomes import WorkloadRequest
from sluicegate.sim.capacity import slot_cap
from sluicegate.sim.comparison import run_comparison
from sluicegate.sim.run_summary import summarize
from sluicegate.sim.virtual_driver import simulate
from sluicegate.sim.workload_options import DEFAULT_POLICIES

runner = CliRunner()
MODEL = "m"
# A shared batch whose every step costs 10 ms: a request of output o runs o steps.
LOCKSTEP = EngineConfig(
    max_num_seqs=64, max_num_batched_tokens=4096, kv_capacity_tokens=100_000, base_s=0.01
)
NEW_KEYS = (
    "any_step_running", "capacity_rps", "kv_usage_mean", "kv_usage_peak", "load", "slot_cap",
    "slot_occupancy",
)  # fmt: skip


def one_lane(cap: int, **lane: object) -> SchedulerSpec:
    """One model with one lane ``main`` capped at ``cap`` (model cap 64)."""
    spec = LaneSpec(name="main", max_concurrency=cap, **lane)  # type: ignore[arg-type]
    return SchedulerSpec(models=(ModelSpec(name=MODEL, lanes=(spec,), max_concurrency=64),))


@pytest.mark.parametrize(
    ("arrivals", "occupancy", "stepping"),
    [
        ((0.0,) * 4, 1.0, 1.0),  # 4 of 4 slots for the whole 0.5 s span
        ((0.0,) * 2, 0.5, 1.0),  # 2 of 4
        ((0.0,) * 8, 1.0, 1.0),  # two full waves back to back
        ((0.0, 1.0), 1.0 / 6.0, 2.0 / 3.0),  # 1 of 4 for 0.5 s twice, over a 1.5 s span
    ],
)
def test_slot_occupancy_is_running_requests_over_the_cap(
    arrivals: tuple[float, ...], occupancy: float, stepping: float
) -> None:
    """Requests of output 50 run 50 lockstep steps (0.5 s); occupancy is the time-average
    of running requests ÷ the lane cap of 4, ``any step running`` the non-idle share."""
    spec = one_lane(4)
    work = [WorkloadRequest(at, 96, 50, 50, lane="main") for at in arrivals]
    result = simulate(spec, MODEL, work, LOCKSTEP, 1, seed=0, scrape_interval_s=0.1)
    summary = summarize(result, slot_cap=slot_cap(spec, MODEL, 1, LOCKSTEP.max_num_seqs))
    assert summary.slot_cap == 4
    assert summary.slot_occupancy == pytest.approx(occupancy, rel=1e-12)
    assert summary.any_step_running == pytest.approx(stepping, rel=1e-12)
    kv = result.samples.kv_usage
    assert summary.kv_usage_peak == max(kv) > 0.0
    assert summary.kv_usage_mean == pytest.approx(math.fsum(kv) / len(kv), rel=1e-12)
    assert summary.load is None  # no capacity given


CONFIG = Config(
    models=(ModelSpec(name=MODEL, lanes=(LaneSpec(name="main", max_concurrency=4),)),),
    tenants=(TenantConfig(name="a", default_lane="main"),),
    simulation=SimulationSpec(preset="tiny", replicas=1, scrape_interval_s=0.5),
)


def poisson_like(n: int, gap_s: float, tenant: str = "a") -> list[WorkloadRequest]:
    """``n`` requests of varied sizes, one every ``gap_s`` seconds."""
    return [
        WorkloadRequest(i * gap_s, 20 + 37 * i % 180, (o := 5 + 11 * i % 90), o + 10,
                        tenant=tenant, lane="main")
        for i in range(n)
    ]  # fmt: skip


def test_results_json_reports_load_against_one_capacity(tmp_path: Path) -> None:
    """Every run, swept ones included, carries the one measured capacity, its offered
    rate and ρ = offered ÷ capacity (to the 6 significant digits written); the old
    ``utilization``/``batch_occupancy`` keys are gone."""
    run_comparison(
        CONFIG, poisson_like(120, 0.25), ["fifo", "config"], out_dir=tmp_path, sweep=[2.0],
        workers=1,
    )  # fmt: skip
    document = json.loads((tmp_path / "results.json").read_text())
    capacity = document["meta"]["capacity"]["rps"]
    assert capacity > 0.0
    assert document["meta"]["slot_cap"] == 4
    runs = [*document["policies"].values(), *document["sweep"]]
    assert len(runs) == 4
    for run in runs:
        assert set(NEW_KEYS) <= set(run)
        assert not {"utilization", "batch_occupancy"} & set(run)
        assert run["capacity_rps"] == capacity
        assert run["load"] == pytest.approx(run["offered_rps"] / capacity, rel=1e-5)
        assert run["slot_cap"] == 4
        assert 0.0 < run["slot_occupancy"] <= 1.0
        assert 0.0 <= run["kv_usage_mean"] <= run["kv_usage_peak"] <= 1.0
    by_label = {run["label"]: run for run in runs}
    assert by_label["fifo ×2"]["load"] == pytest.approx(2 * by_label["fifo"]["load"], rel=1e-5)


def test_config_policy_runs_the_configs_own_fair_lane(tmp_path: Path) -> None:
    """``config`` keeps the lane's ``fair`` policy (VTC fairness): a quiet tenant is
    served almost at once while a heavy one floods the lane; ``fifo`` makes it wait
    behind the flood."""
    lane = LaneSpec(
        name="main", max_concurrency=4, policy="fair", max_queue=10_000,
        queue_timeout_s=1000.0, slo_ms=1e6,
    )  # fmt: skip
    config = Config(
        models=(ModelSpec(name=MODEL, lanes=(lane,)),),
        tenants=(
            TenantConfig(name="heavy", default_lane="main"),
            TenantConfig(name="quiet", default_lane="main"),
        ),
        simulation=SimulationSpec(preset="tiny", replicas=1, scrape_interval_s=0.5),
    )
    flood = [
        WorkloadRequest(i * 0.01, 100, 60, 60, tenant="heavy", lane="main") for i in range(300)
    ]
    quiet = [WorkloadRequest(0.5 + i, 100, 60, 60, tenant="quiet", lane="main") for i in range(15)]
    work = sorted(flood + quiet, key=lambda w: w.arrival_s)
    out = run_comparison(config, work, ["config", "fifo"], out_dir=tmp_path, workers=1)
    assert dict(out.results["config"].policies) == {"main": "fair"}
    assert dict(out.results["fifo"].policies) == {"main": "fifo"}
    waits = {s.label: s.tenants["quiet"].queue_wait.p50 for s in out.summaries}
    assert waits["config"] is not None
    assert waits["fifo"] is not None
    assert waits["config"] < 0.05 * waits["fifo"]
    assert (tmp_path / "requests-config.csv").is_file()


def test_config_is_the_default_policy(tmp_path: Path) -> None:
    """Without ``--policy`` simulate runs ``config`` alone and labels it so."""
    assert DEFAULT_POLICIES == ("config",)
    path = tmp_path / "sim.yaml"
    path.write_text(
        "models:\n  - name: m\n    lanes:\n      - {name: interactive, policy: fair}\n"
        "simulation: {preset: tiny, replicas: 1}\n"
    )
    out = tmp_path / "out"
    result = runner.invoke(
        app,
        ["simulate", "--config", str(path), "--poisson", "2", "--duration", "5",
         "--out", str(out), "--workers", "1"],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    document = json.loads((out / "results.json").read_text())
    assert list(document["policies"]) == ["config"]
    assert sorted(p.name for p in out.glob("requests-*.csv")) == ["requests-config.csv"]
    assert "load ρ" in result.output


def test_unknown_policy_is_refused_naming_config(tmp_path: Path) -> None:
    """A misspelt ``--policy`` exits 1, listing ``config`` among the choices, and writes
    nothing."""
    result = runner.invoke(
        app,
        ["simulate", "--poisson", "2", "--duration", "5", "--policy", "confg",
         "--out", str(tmp_path / "out"), "--workers", "1"],
    )  # fmt: skip
    assert result.exit_code == 1
    assert "confg" in result.output
    assert "'config'" in result.output
    assert not (tmp_path / "out").exists()
