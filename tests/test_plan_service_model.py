"""``sluicegate plan --preset P --workload W``: the service time from the engine model."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from typer.testing import CliRunner

from sluicegate.cli import app
from sluicegate.engine.engine_config import EngineConfig
from sluicegate.engine.presets import preset
from sluicegate.outcomes import WorkloadRequest
from sluicegate.planner.service_model import service_from_model

ROOT = Path(__file__).resolve().parents[1]
AZURE = ROOT / "data" / "traces" / "AzureLLMInferenceTrace_conv.csv"
runner = CliRunner()
WIDE = {"COLUMNS": "200"}


def _same(count: int, prompt: int, output: int) -> list[WorkloadRequest]:
    return [WorkloadRequest(0.0, prompt, output, output) for _ in range(count)]


def test_independent_servers_serve_each_request_in_its_solo_time() -> None:
    """On ``batch_independent`` servers every request takes its solo service time, so
    identical requests give exactly that mean, no variability, and slots ÷ solo per second."""
    engine = EngineConfig(
        max_num_seqs=4, max_num_batched_tokens=4096, kv_capacity_tokens=65536,
        base_s=0.01, per_prefill_token_s=1e-4, per_decode_seq_s=2e-3,
        batch_independent=True,
    )  # fmt: skip
    solo = engine.solo_service_s(200, 40)
    estimate = service_from_model(engine, _same(10, 200, 40), slots=4)
    assert estimate.mean_s == pytest.approx(solo, rel=1e-9)
    assert estimate.cv == pytest.approx(0.0, abs=1e-9)
    assert estimate.capacity_rps == pytest.approx(4 / solo, rel=0.02)
    assert estimate.requests >= 2000


def test_a_shared_batch_trades_latency_for_capacity() -> None:
    """On a shared batch, admitting more at once makes each request slower (steps carry
    more sequences) and the replica faster: both move the way an engine's do."""
    engine = preset("llama-3.1-8b-h100")
    mix = _same(10, 1000, 200)
    few = service_from_model(engine, mix, slots=4)
    many = service_from_model(engine, mix, slots=64)
    assert few.mean_s >= engine.solo_service_s(1000, 200) * 0.999
    assert many.mean_s > few.mean_s * 1.2
    assert many.capacity_rps > few.capacity_rps * 4


def test_the_overheads_are_part_of_the_service() -> None:
    """The request's fixed overheads hold the gateway's slot, so they are service time."""
    base = EngineConfig(
        max_num_seqs=2, max_num_batched_tokens=4096, kv_capacity_tokens=65536,
        base_s=0.01, batch_independent=True,
    )  # fmt: skip
    slow = EngineConfig(
        max_num_seqs=2, max_num_batched_tokens=4096, kv_capacity_tokens=65536,
        base_s=0.01, batch_independent=True, request_overhead_s=0.05, response_overhead_s=0.02,
    )  # fmt: skip
    mix = _same(4, 50, 10)
    gap = service_from_model(slow, mix, 2).mean_s - service_from_model(base, mix, 2).mean_s
    assert gap == pytest.approx(0.07, rel=1e-6)


def test_service_from_model_refuses_what_it_cannot_measure() -> None:
    """No slots or no requests: a ValueError that says which."""
    engine = preset("tiny")
    with pytest.raises(ValueError, match="slots"):
        service_from_model(engine, _same(3, 10, 10), slots=0)
    with pytest.raises(ValueError, match="no requests"):
        service_from_model(engine, [], slots=2)


def test_plan_takes_the_service_time_from_a_preset_and_a_trace(tmp_path: Path) -> None:
    """``--preset`` and ``--workload`` replace ``--service-s``: the plan prints the
    engine model's figure and plans with it."""
    result = runner.invoke(
        app,
        ["plan", "--rate", "20", "--slots", "32", "--slo-s", "2", "--preset",
         "llama-3.1-8b-h100", "--workload", str(AZURE), "--out", str(tmp_path)],
        env=WIDE,
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    line = next(x for x in result.output.splitlines() if x.startswith("engine model"))
    mean = float(line.split("service ")[1].split(" s mean")[0])
    assert math.isfinite(mean)
    assert 0.5 < mean < 30.0
    assert "llama-3.1-8b-h100, 32 slots" in line
    assert (tmp_path / "p99-wait-vs-utilization.png").exists()


@pytest.mark.parametrize(
    ("extra", "says"),
    [
        ([], "give --service-s, or --preset and --workload"),
        (["--preset", "tiny"], "go together"),
        (["--workload", str(AZURE)], "go together"),
        (["--preset", "tiny", "--workload", str(AZURE), "--service-s", "3"], "replace"),
        (["--preset", "no-such-engine", "--workload", str(AZURE)], "no-such-engine"),
        (["--preset", "tiny", "--workload", "/nonexistent/trace.csv"], "trace.csv"),
    ],
)
def test_plan_refuses_a_service_it_cannot_know(tmp_path: Path, extra: list[str], says: str) -> None:
    """Neither a service time nor an engine model, half of one, both, or a preset or
    trace that does not exist: exit 2 with a message naming what is wrong."""
    args = ["plan", "--rate", "2", "--slots", "4", "--slo-s", "2", "--out", str(tmp_path)]
    result = runner.invoke(app, args + extra, env=WIDE)
    assert result.exit_code == 2
    assert says in result.output
