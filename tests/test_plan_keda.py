"""Tests for the KEDA thresholds of a plan, the ScaledObject fragment and ``sluicegate plan``."""

from __future__ import annotations

import math
import re
import shutil
import subprocess
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import typer
import yaml
from typer.testing import CliRunner

from sluicegate.cli import app
from sluicegate.planner.keda import (
    DEFAULT_PROMETHEUS_URL,
    SMALLEST_WAIT_BUCKET_S,
    KedaPlan,
    plan_keda,
    saturation_rate,
    scaled_object_fragment,
)
from sluicegate.planner.queueing import PlanInput, allen_cunneen_wait, plan_capacity
from sluicegate.planner.warm_buffer import Burst, WarmPlan, plan_warm_buffer

README_INPUT = PlanInput(
    arrival_rate=20.0, mean_service_s=4.0, cv_service=1.5, slots_per_replica=32, p99_wait_slo_s=2.0
)
"""The README's example (``README_ARGS``), shared with ``test_plan_warm``."""
README_ARGS = ["plan", "--rate", "20", "--service-s", "4", "--slots", "32", "--slo-s", "2",
               "--cv-service", "1.5", "--model", "llama-3.1-8b"]  # fmt: skip
PROMTOOL = shutil.which("promtool")
runner = CliRunner()
WIDE = {"COLUMNS": "200"}


def _warm(inp: PlanInput = README_INPUT, burst: Burst | None = None) -> WarmPlan:
    return plan_warm_buffer(plan_capacity(inp), burst or Burst())


def _fragment(keda: KedaPlan) -> dict[str, Any]:
    parsed = yaml.safe_load(scaled_object_fragment(keda))
    assert isinstance(parsed, dict)
    return parsed


def _words(text: str) -> str:
    return " ".join(re.sub("[\u2500-\u257f]", " ", text).split())


def test_saturation_rate_is_where_p99_reaches_the_slo() -> None:
    """At the saturation rate the replicas' Allen–Cunneen p99 equals the SLO."""
    rate = saturation_rate(README_INPUT, 6)
    assert 20.0 < rate < 6 * 32 / 4.0
    p99 = allen_cunneen_wait(rate, 4.0, 1.0, 1.5, 6 * 32).p99_wait_s
    assert p99 == pytest.approx(2.0, rel=1e-6)


def test_wait_threshold_is_the_p95_at_saturation_of_min_replicas() -> None:
    """Threshold = p95 wait when base + warm replicas reach the p99 SLO, to 3 digits."""
    warm = _warm()
    keda = plan_keda(warm)
    rate = saturation_rate(README_INPUT, warm.min_replicas)
    p95 = allen_cunneen_wait(rate, 4.0, 1.0, 1.5, warm.min_replicas * 32).wait_quantile(0.95)
    assert keda.saturation_rate == rate
    assert keda.wait_threshold_s == pytest.approx(p95, rel=5e-3)
    assert SMALLEST_WAIT_BUCKET_S < keda.wait_threshold_s < README_INPUT.p99_wait_slo_s
    assert keda.note == ""


def test_depth_target_is_the_backlog_that_drains_in_the_threshold() -> None:
    """AverageValue = ⌈threshold · slots / E[S]⌉, well above Little's mean depth at the plan."""
    keda = plan_keda(_warm())
    assert keda.depth_per_replica == math.ceil(keda.wait_threshold_s * 32 / 4.0)
    assert keda.mean_depth_per_replica < 0.1 * keda.depth_per_replica


def test_replica_bounds() -> None:
    """min = base + warm; max = replicas for the burst rate, at least min + 1."""
    warm = _warm(burst=Burst(factor=3.0))
    keda = plan_keda(warm)
    assert keda.min_replicas == warm.base_replicas + warm.warm
    assert warm.burst_replicas is not None
    assert keda.max_replicas == max(warm.burst_replicas, keda.min_replicas + 1)
    assert keda.scale_up_pods == keda.max_replicas - keda.min_replicas


def test_tiny_slo_floors_threshold_at_smallest_bucket_and_says_so() -> None:
    """When the p95 is still 0 at the SLO, the threshold is 5 ms and a note suggests p99."""
    inp = replace(README_INPUT, p99_wait_slo_s=0.001, slots_per_replica=8, mean_service_s=1.0)
    keda = plan_keda(_warm(inp))
    assert keda.wait_threshold_s == SMALLEST_WAIT_BUCKET_S
    assert "--trigger-quantile 0.99" in keda.note


@pytest.mark.parametrize("bad", [{"model": ""}, {"model": "a\nb"}, {"wait_quantile": 1.0}])
def test_plan_keda_validates(bad: dict[str, Any]) -> None:
    """Empty or multi-line model names and quantiles outside [0.5, 1) are refused."""
    with pytest.raises(ValueError, match=r"model|quantile"):
        plan_keda(_warm(), **bad)


def test_fragment_is_the_scaled_object_spec() -> None:
    """The fragment parses as YAML with the plan's bounds, behaviour and two triggers."""
    keda = plan_keda(_warm(), model="llama-3.1-8b")
    spec = _fragment(keda)
    assert spec["minReplicaCount"] == keda.min_replicas
    assert spec["maxReplicaCount"] == keda.max_replicas
    assert "idleReplicaCount" not in spec
    behavior = spec["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]
    assert behavior["scaleUp"]["stabilizationWindowSeconds"] == 30
    assert {"type": "Pods", "value": keda.scale_up_pods, "periodSeconds": 15} in behavior[
        "scaleUp"
    ]["policies"]
    wait, depth = spec["triggers"]
    assert (wait["type"], wait["name"], wait["metricType"]) == (
        "prometheus",
        "queue-wait-p95",
        "Value",
    )
    assert wait["metadata"] == {
        "serverAddress": DEFAULT_PROMETHEUS_URL,
        "query": keda.wait_query,
        "threshold": f"{keda.wait_threshold_s:g}",
        "activationThreshold": "0",
    }
    assert 'sluicegate_queue_wait_seconds_bucket{model="llama-3.1-8b"}[1m]' in keda.wait_query
    assert (depth["name"], depth["metricType"]) == ("queue-depth", "AverageValue")
    assert (
        depth["metadata"]["query"]
        == 'sum(sluicegate_queue_depth{model="llama-3.1-8b"}) or vector(0)'
    )
    assert depth["metadata"]["threshold"] == str(keda.depth_per_replica)


def test_scale_to_zero_fragment_sleeps_and_counts_activity() -> None:
    """idleReplicaCount 0 below min, and a third trigger on in-flight plus queued requests."""
    keda = plan_keda(_warm(), model="m", scale_to_zero=True)
    spec = _fragment(keda)
    assert spec["idleReplicaCount"] == 0 < spec["minReplicaCount"]
    activity = spec["triggers"][2]
    assert activity["name"] == "activity"
    assert "sluicegate_inflight_requests" in activity["metadata"]["query"]
    assert activity["metadata"]["threshold"] == "32"
    assert keda.cold_start_s == 5 + 90.0


def test_fragment_escapes_awkward_model_names() -> None:
    """Quotes and backslashes survive YAML and land escaped in the PromQL string."""
    model = "we\"ird\\model's"
    spec = _fragment(plan_keda(_warm(), model=model))
    query = spec["triggers"][1]["metadata"]["query"]
    assert query == 'sum(sluicegate_queue_depth{model="we\\"ird\\\\model\'s"}) or vector(0)'


def _promtool_test(queries: dict[str, str], tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """Evaluate the shipped queries on synthetic series with ``promtool test rules``."""
    hist = "sluicegate_queue_wait_seconds_bucket"
    series = [
        (f'{hist}{{model="we\\"ird",lane="a",le="{le}"}}', f"0+{step}x20")
        for le, step in (("0.5", 5), ("1", 9), ("2", 10), ("+Inf", 10))
    ]
    series += [(f'{hist}{{model="idle",lane="a",le="{le}"}}', "0x20") for le in ("1", "+Inf")]
    series += [
        ('sluicegate_queue_depth{model="we\\"ird",lane="a"}', "3x20"),
        ('sluicegate_queue_depth{model="we\\"ird",lane="b"}', "4x20"),
        ('sluicegate_inflight_requests{model="we\\"ird",lane="a"}', "5x20"),
    ]
    tests = [{"expr": expr, "eval_time": "4m", "exp_samples": [{"labels": "{}", "value": v}]}
             for expr, v in queries.items()]  # fmt: skip
    spec = {
        "rule_files": [],
        "evaluation_interval": "15s",
        "tests": [
            {
                "interval": "15s",
                "input_series": [{"series": s, "values": v} for s, v in series],
                "promql_expr_test": tests,
            }
        ],
    }
    path = tmp_path / "plan-queries.test.yml"
    path.write_text(yaml.safe_dump(spec), encoding="utf-8")
    assert PROMTOOL is not None
    return subprocess.run(
        [PROMTOOL, "test", "rules", str(path)], capture_output=True, text=True, timeout=60
    )


@pytest.mark.skipif(PROMTOOL is None, reason="promtool missing: make test installs prometheus")
def test_queries_evaluate_in_prometheus(tmp_path: Path) -> None:
    """promtool evaluates every trigger query: p95 by interpolation, sums, NaN or absence → 0.

    Buckets gain 5 / 9 / 10 / 10 per scrape (le 0.5 / 1 / 2 / +Inf): the p95 rank 9.5 lies
    halfway through (1, 2], so 1.5 s. Depth 3 + 4 over two lanes; activity adds 5 in flight.
    """
    busy = plan_keda(_warm(), model='we"ird', scale_to_zero=True)
    idle = plan_keda(_warm(), model="idle", scale_to_zero=True)
    expected = {
        busy.wait_query: 1.5,
        busy.depth_query: 7.0,
        busy.activity_query: 12.0,
        idle.wait_query: 0.0,
        idle.depth_query: 0.0,
        idle.activity_query: 0.0,
    }
    result = _promtool_test(expected, tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    wrong = _promtool_test({busy.wait_query: 1.4}, tmp_path)
    assert wrong.returncode == 1, "promtool must reject a wrong expected value"


def test_plan_help_documents_every_option() -> None:
    """Every option of ``plan`` has help text, and ``--help`` names them all."""
    plan = typer.main.get_command(app).commands["plan"]  # type: ignore[attr-defined]
    result = runner.invoke(app, ["plan", "--help"], env=WIDE)
    assert result.exit_code == 0, result.output
    options = [p for p in plan.params if p.param_type_name == "option" and p.name != "help"]
    names = {option.name for option in options}
    assert names >= {"burst_factor", "scale_up_s", "detect_s", "model", "prometheus_url",
                     "trigger_quantile", "scale_to_zero", "out"}  # fmt: skip
    for option in options:
        assert option.help, option.name
        assert option.opts[0] in result.output, option.opts[0]


def test_plan_cli_prints_warm_buffer_keda_and_writes_fragment(tmp_path: Path) -> None:
    """The CLI prints the warm-buffer and KEDA tables and the fragment it writes to --out."""
    result = runner.invoke(app, [*README_ARGS, "--out", str(tmp_path)], env=WIDE)
    assert result.exit_code == 0, result.output
    words = _words(result.output)
    assert "recommended warm 3" in words
    assert "keep up: base + warm 6" in words
    assert "rule of thumb, 2 idle per 8 active" in words
    assert "3 (plan) 6 83.3%" in words
    fragment = (tmp_path / "keda-scaledobject.yaml").read_text(encoding="utf-8")
    assert fragment in result.output
    keda = plan_keda(_warm(), model="llama-3.1-8b")
    assert fragment == scaled_object_fragment(keda)
    assert f"queue-wait p95 threshold (Value) {keda.wait_threshold_s:.3f} s" in words


def test_plan_cli_burst_options_change_the_plan(tmp_path: Path) -> None:
    """--burst-factor 1 needs no warm; --scale-to-zero adds idleReplicaCount to the fragment."""
    result = runner.invoke(
        app,
        [*README_ARGS, "--burst-factor", "1", "--scale-to-zero", "--out", str(tmp_path)],
        env=WIDE,
    )
    assert result.exit_code == 0, result.output
    assert "recommended warm 0" in _words(result.output)
    spec = yaml.safe_load((tmp_path / "keda-scaledobject.yaml").read_text(encoding="utf-8"))
    assert spec["idleReplicaCount"] == 0
    assert spec["minReplicaCount"] == 3


@pytest.mark.parametrize(
    ("flag", "value", "message"),
    [
        ("--burst-factor", "0.5", "burst factor"),
        ("--scale-up-s", "-1", "scale_up_s"),
        ("--trigger-quantile", "1.5", "quantile"),
    ],
)
def test_plan_cli_rejects_bad_burst_options(
    tmp_path: Path, flag: str, value: str, message: str
) -> None:
    """Out-of-range burst or trigger options exit 1 naming the option's range."""
    result = runner.invoke(app, [*README_ARGS, flag, value, "--out", str(tmp_path)], env=WIDE)
    assert result.exit_code == 1
    assert message in result.output
    assert not (tmp_path / "keda-scaledobject.yaml").exists()
