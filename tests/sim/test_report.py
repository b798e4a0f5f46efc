"""Summary statistics, report files and the policy comparison entry point (DESIGN §12)."""

from __future__ import annotations

import csv
import io
import json
import math
from pathlib import Path

import numpy as np
import pytest
from rich.console import Console

from sluicegate.config import Config, SimulationSpec, TenantConfig
from sluicegate.core.spec import LaneSpec, ModelSpec
from sluicegate.outcomes import RequestOutcome, WorkloadRequest
from sluicegate.sim.comparison import run_comparison
from sluicegate.sim.report import CSV_COLUMNS, comparison_tables, write_csv, write_json
from sluicegate.sim.result import SimResult
from sluicegate.sim.run_summary import group_stats, jain_index, summarize

LANE = LaneSpec(
    name="main", max_concurrency=4, max_queue=40, queue_timeout_s=5.0, slo_ms=2000.0, policy="fifo"
)
CONFIG = Config(
    models=(ModelSpec(name="m", lanes=(LANE,), max_concurrency=4),),
    tenants=(
        TenantConfig(name="a", default_lane="main"),
        TenantConfig(name="b", weight=2.0, default_lane="main"),
    ),
    simulation=SimulationSpec(preset="tiny", replicas=1, scrape_interval_s=0.5),
)


def workload(n: int = 300, rate: float = 20.0, seed: int = 0) -> list[WorkloadRequest]:
    """Poisson arrivals from two tenants, enough to queue on a cap of 4."""
    rng = np.random.default_rng(seed)
    times = np.cumsum(rng.exponential(1.0 / rate, n))
    return [
        WorkloadRequest(
            float(at), int(rng.integers(20, 200)), (out := int(rng.integers(5, 120))), out + 10,
            tenant="a" if i % 3 else "b", lane="main",
        )
        for i, at in enumerate(times)
    ]  # fmt: skip


def compare(out_dir: Path, *, sweep: list[float] | None = None, workers: int = 1) -> None:
    """Compare fifo and sjf on the standard workload into ``out_dir``."""
    run_comparison(
        CONFIG, workload(), ["fifo", "sjf"], out_dir=out_dir, seed=3, sweep=sweep, workers=workers
    )


def record(
    outcome: str = "completed",
    *,
    arrival: float = 0.0,
    finish: float | None = 1.0,
    **fields: object,
) -> RequestOutcome:
    """A hand-made record; deadline 2 s after arrival."""
    values: dict[str, object] = {
        "index": 0, "tenant": "a", "lane": "main", "priority": 2, "outcome": outcome,
        "arrival_s": arrival, "admit_s": None if outcome.startswith("rejected") else arrival,
        "first_token_s": None, "finish_s": finish, "deadline_s": arrival + 2.0,
        "prompt_tokens": 10, "output_tokens": 5, "generated_tokens": 5, "replica": "r0",
        "requeues": 0,
    }  # fmt: skip
    values.update(fields)
    return RequestOutcome(**values)  # type: ignore[arg-type]


# ---------------------------------------------------------------- statistics


def test_slo_attainment_counts_rejected_requests_as_misses() -> None:
    """Two on time, one late, one rejected: attainment 2/4."""
    records = [
        record(finish=1.0),
        record(finish=1.5),
        record(finish=3.0),
        record("rejected_queue_full", finish=0.0, generated_tokens=0),
    ]
    stats = group_stats(records, span_s=10.0, weights={})
    assert stats.slo_attainment == pytest.approx(0.5)
    assert stats.goodput_rps == pytest.approx(0.2)
    assert stats.outcomes == {"completed": 3, "rejected_queue_full": 1}


def test_jain_index_is_one_for_equal_shares_and_one_over_n_for_a_monopoly() -> None:
    """J = (Σx)²/(n·Σx²): 1 when all equal, 1/n when one tenant gets everything."""
    assert jain_index([3.0, 3.0, 3.0]) == pytest.approx(1.0)
    assert jain_index([5.0, 0.0, 0.0, 0.0]) == pytest.approx(0.25)
    assert jain_index([]) is None


def test_fairness_divides_service_by_tenant_weight() -> None:
    """A tenant of weight 2 served twice as much is a fair share."""
    records = [record(tenant="a"), record(tenant="b"), record(tenant="b")]
    assert group_stats(records, 1.0, {"b": 2.0}).fairness == pytest.approx(1.0)
    assert group_stats(records, 1.0, {}).fairness == pytest.approx(0.9)


@pytest.fixture(scope="module")
def comparison_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One comparison of fifo and sjf with a ×2 sweep."""
    out = tmp_path_factory.mktemp("compare")
    compare(out, sweep=[2.0])
    return out


def test_comparison_writes_json_csv_and_plots(comparison_dir: Path) -> None:
    """results.json, one CSV per policy, a CDF per lane, queue depth and p99-vs-load."""
    names = {p.name for p in comparison_dir.iterdir()}
    assert names == {
        "results.json", "requests-fifo.csv", "requests-sjf.csv",
        "latency-cdf-main.png", "queue-depth.png", "p99-vs-load.png",
    }  # fmt: skip


def test_json_has_sorted_keys_and_six_significant_digits(comparison_dir: Path) -> None:
    """The JSON is its own sorted re-serialisation; floats carry at most 6 significant digits."""
    text = (comparison_dir / "results.json").read_text(encoding="utf-8")
    data = json.loads(text)
    assert text == json.dumps(data, sort_keys=True, indent=2, ensure_ascii=False) + "\n"
    floats: list[float] = []

    def collect(node: object) -> None:
        if isinstance(node, float):
            floats.append(node)
        elif isinstance(node, dict):
            for value in node.values():
                collect(value)
        elif isinstance(node, list):
            for value in node:
                collect(value)

    collect(data)
    assert floats
    assert all(float(f"{x:.6g}") == x for x in floats)
    assert set(data["policies"]) == {"fifo", "sjf"}


def test_sweep_runs_scale_the_offered_load(comparison_dir: Path) -> None:
    """A ×2 multiplier doubles the offered request rate."""
    data = json.loads((comparison_dir / "results.json").read_text(encoding="utf-8"))
    base = data["policies"]["fifo"]["offered_rps"]
    swept = [s for s in data["sweep"] if s["label"] == "fifo ×2"]
    assert len(swept) == 1
    assert swept[0]["offered_rps"] == pytest.approx(2 * base, rel=1e-5)


def test_csv_has_one_row_per_request_in_workload_order(comparison_dir: Path) -> None:
    """Header then one row per request, indices 0…n−1; missing times are empty cells."""
    with (comparison_dir / "requests-fifo.csv").open(encoding="utf-8", newline="") as handle:
        rows = list(csv.reader(handle))
    assert tuple(rows[0]) == CSV_COLUMNS
    assert [int(row[0]) for row in rows[1:]] == list(range(len(workload())))
    column = CSV_COLUMNS.index
    for row in rows[1:]:
        ran = row[column("outcome")] in {"completed", "preempted"}
        assert (row[column("admit_s")] == "") == (not ran)


def test_identical_inputs_give_byte_identical_files(comparison_dir: Path, tmp_path: Path) -> None:
    """A second comparison, run in two worker processes, writes the same bytes, PNGs included."""
    compare(tmp_path, sweep=[2.0], workers=2)
    for path in sorted(comparison_dir.iterdir()):
        assert (tmp_path / path.name).read_bytes() == path.read_bytes(), path.name


# ---------------------------------------------------------------- tables and entry point


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> dict[str, SimResult]:
    """fifo and sjf runs on two replicas, straight from ``run_comparison``."""
    out = run_comparison(
        CONFIG, workload(), ["fifo", "sjf"], model="m", preset="tiny", replicas=2,
        out_dir=tmp_path_factory.mktemp("results"), workers=1,
    )  # fmt: skip
    return dict(out.results)


def test_tables_put_policies_side_by_side(results: dict[str, SimResult]) -> None:
    """Each table has a column per policy; there is one per lane and per tenant."""
    summaries = [summarize(r, label=label) for label, r in results.items()]
    console = Console(file=io.StringIO(), width=200)
    tables = comparison_tables(summaries)
    titles = [str(t.title) for t in tables]
    assert titles == ["all requests", "lane main", "tenant a", "tenant b", "engines"]
    for table in tables:
        console.print(table)
        assert [str(c.header) for c in table.columns][1:] == ["fifo", "sjf"]
    text = console.file.getvalue()  # type: ignore[attr-defined]
    assert "p99" in text
    assert "SLO attainment" in text


def test_step_time_and_slot_occupancy_are_fractions(results: dict[str, SimResult]) -> None:
    """The share of time any step ran and the slot occupancy against the gateway's cap
    (4 here: model and lane cap 4, below 2 replicas × 32 sequences) lie in (0, 1];
    replicas come from the argument."""
    for result in results.values():
        summary = summarize(result, slot_cap=4)
        assert summary.replicas == 2
        assert 0.0 < summary.any_step_running <= 1.0
        assert 0.0 < summary.slot_occupancy <= 1.0
        assert math.isclose(summary.span_s, result.end_s - result.start_s)


def test_unknown_policies_are_refused_before_anything_runs(tmp_path: Path) -> None:
    """A misspelt policy raises ``ValueError`` listing the known ones."""
    with pytest.raises(ValueError, match="fifo"):
        run_comparison(
            CONFIG, workload(10), ["fifoo"], out_dir=tmp_path,
        )  # fmt: skip
    assert not any(tmp_path.iterdir())


def test_console_output_shows_tables_and_progress(tmp_path: Path) -> None:
    """With a console, the comparison prints its tables and where it wrote the files."""
    console = Console(file=io.StringIO(), width=160)
    run_comparison(
        CONFIG, workload(50), ["fifo"], out_dir=tmp_path, console=console, workers=1,
    )  # fmt: skip
    text = console.file.getvalue()  # type: ignore[attr-defined]
    assert "lane main" in text
    assert "results.json" in text


def test_write_json_and_csv_return_their_paths(
    results: dict[str, SimResult], tmp_path: Path
) -> None:
    """The writers return the path they wrote."""
    fifo = results["fifo"]
    assert write_csv(tmp_path / "r.csv", fifo) == tmp_path / "r.csv"
    assert write_json(tmp_path / "s.json", [summarize(fifo)]) == tmp_path / "s.json"
