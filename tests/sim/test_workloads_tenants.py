"""``--tenant-load``: per-tenant Poisson arrivals, periodic bursts, trace lengths (DESIGN §12)."""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from sluicegate.cli import app
from sluicegate.outcomes import WorkloadRequest
from sluicegate.sim.workload_options import build_workload, workload_options
from sluicegate.sim.workloads.tenants import Burst, TenantLoad, parse_tenant_load, tenant_loads

ROOT = Path(__file__).resolve().parents[2]
TRACE = ROOT / "data" / "traces" / "AzureLLMInferenceTrace_conv.csv"
LENGTHS = [WorkloadRequest(0.0, 100 + i, 10 + i, 20 + i) for i in range(5)]


def _options(*loads: str, **overrides: Any) -> dict[str, Any]:
    fields: dict[str, Any] = {
        "trace": None, "poisson_rate": None, "gamma": None, "duration_s": 100.0,
        "window": None, "rate_scale": 1.0, "mix": None, "seed": 3,
        "tenant_load": tuple(loads),
    }  # fmt: skip
    fields.update(overrides)
    return fields


# ------------------------------------------------------------------ parsing


def test_parse_a_plain_and_a_bursty_load() -> None:
    """The documented examples, and every option."""
    assert parse_tenant_load("quiet:3") == TenantLoad("quiet", 3.0)
    assert parse_tenant_load("noisy:3:burst=10x20s/200s") == TenantLoad(
        "noisy", 3.0, Burst(10.0, 20.0, 200.0)
    )
    assert parse_tenant_load("n:0.5:burst=4x5s/60s@30s:lane=shared:priority=4") == TenantLoad(
        "n", 0.5, Burst(4.0, 5.0, 60.0, 30.0), lane="shared", priority=4
    )


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("quiet", "TENANT:RATE"),
        ("quiet:x", "RATE is not a number"),
        ("quiet:0", "rate must be a finite number > 0"),
        ("quiet:3:bursty=1", "bad or repeated option"),
        ("quiet:3:lane=a:lane=b", "bad or repeated option"),
        ("quiet:3:burst=10x20/200s", "burst must look like"),
        ("quiet:3:burst=1x20s/200s", "burst factor must be a finite number > 1"),
        ("quiet:3:burst=10x20s/10s", "must fit its period"),
        ("quiet:3:burst=10x20s/200s@190s", "must fit its period"),
        ("quiet:3:priority=9", "priority must be in [0, 5]"),
        ("quiet:3:priority=high", "priority must be an integer"),
        (":3", "tenant and lane must be non-empty"),
    ],
)
def test_bad_specs_are_refused_with_the_reason(text: str, message: str) -> None:
    """Each malformed spec raises ``ValueError`` saying what is wrong."""
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
        parse_tenant_load(text)


# ------------------------------------------------------------------ generation


def test_same_seed_same_workload_and_tenants_are_independent() -> None:
    """Deterministic for a seed; adding a tenant leaves the first tenant's stream unchanged."""
    quiet = parse_tenant_load("quiet:3")
    noisy = parse_tenant_load("noisy:3:burst=10x20s/200s")
    one = tenant_loads([quiet], LENGTHS, 400.0, seed=1)
    both = tenant_loads([quiet, noisy], LENGTHS, 400.0, seed=1)
    assert both == tenant_loads([quiet, noisy], LENGTHS, 400.0, seed=1)
    assert [r for r in both if r.tenant == "quiet"] == one
    assert both != tenant_loads([quiet, noisy], LENGTHS, 400.0, seed=2)
    assert all(a.arrival_s <= b.arrival_s for a, b in itertools.pairwise(both))


def test_lengths_are_pairs_drawn_from_the_source() -> None:
    """Every request copies one source request's prompt, output and cap, with its tenant's lane
    and priority."""
    load = parse_tenant_load("t:5:lane=shared:priority=4")
    requests = tenant_loads([load], LENGTHS, 200.0, seed=0)
    pairs = {(r.prompt_tokens, r.output_tokens, r.max_tokens) for r in LENGTHS}
    assert {(r.prompt_tokens, r.output_tokens, r.max_tokens) for r in requests} == pairs
    assert {(r.tenant, r.lane, r.priority) for r in requests} == {("t", "shared", 4)}


def test_bursts_multiply_the_rate_inside_their_windows() -> None:
    """Rate 2 with 10× bursts of 20 s every 200 s over 2000 s: about 2 req/s outside the
    windows and 20 req/s inside (counts within 5 standard deviations of Poisson)."""
    load = parse_tenant_load("n:2:burst=10x20s/200s@50s")
    requests = tenant_loads([load], LENGTHS, 2000.0, seed=4)
    inside = sum(1 for r in requests if 50.0 <= r.arrival_s % 200.0 < 70.0)
    outside = len(requests) - inside
    for count, expected in ((inside, 20 * 20 * 10), (outside, 2 * 180 * 10)):
        assert abs(count - expected) < 5 * expected**0.5, (count, expected)
    assert all(0.0 <= r.arrival_s < 2000.0 for r in requests)


@settings(max_examples=40, deadline=None)
@given(
    rate=st.floats(0.1, 5.0),
    factor=st.floats(1.5, 8.0),
    duration=st.floats(1.0, 30.0),
    period=st.floats(40.0, 100.0),
    horizon=st.floats(10.0, 400.0),
    seed=st.integers(0, 1000),
)
def test_arrivals_stay_in_range_and_sorted(
    rate: float, factor: float, duration: float, period: float, horizon: float, seed: int
) -> None:
    """Any valid load: arrivals in ``[0, duration)``, sorted, deterministic."""
    load = TenantLoad("t", rate, Burst(factor, duration, period, (period - duration) / 2))
    requests = tenant_loads([load], LENGTHS, horizon, seed=seed)
    arrivals = [r.arrival_s for r in requests]
    assert arrivals == sorted(arrivals)
    assert all(0.0 <= a < horizon for a in arrivals)
    assert requests == tenant_loads([load], LENGTHS, horizon, seed=seed)


def test_tenant_loads_refuses_duplicates_and_empty_sources() -> None:
    """One load per tenant; a length source with requests; a positive duration."""
    load = parse_tenant_load("t:1")
    with pytest.raises(ValueError, match="one --tenant-load"):
        tenant_loads([load, load], LENGTHS, 10.0, seed=0)
    with pytest.raises(ValueError, match="no requests"):
        tenant_loads([load], [], 10.0, seed=0)
    with pytest.raises(ValueError, match="duration"):
        tenant_loads([load], LENGTHS, 0.0, seed=0)


# ------------------------------------------------------------------ the CLI's workload


def test_build_workload_samples_the_given_trace(tmp_path: Path) -> None:
    """``--tenant-load`` with ``--trace``: the trace is the length source, not the arrivals."""
    trace = tmp_path / "t.jsonl"
    rows = [{"arrival_s": 0.0, "prompt_tokens": 7, "output_tokens": 3, "max_tokens": 3}]
    trace.write_text("\n".join(json.dumps(r) for r in rows) + "\n", encoding="utf-8")
    requests = build_workload(workload_options(**_options("a:2", "b:1", trace=trace)))
    assert {r.tenant for r in requests} == {"a", "b"}
    assert {(r.prompt_tokens, r.output_tokens) for r in requests} == {(7, 3)}
    assert max(r.arrival_s for r in requests) < 100.0


def test_build_workload_defaults_to_the_shipped_trace(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without ``--trace``, lengths come from the conversation trace (run from the repository)."""
    monkeypatch.chdir(ROOT)
    requests = build_workload(workload_options(**_options("a:2")))
    assert requests
    assert max(r.prompt_tokens for r in requests) > 100


def test_build_workload_says_when_the_default_trace_is_missing(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Run elsewhere, the missing default trace is named."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match="samples lengths from --trace"):
        build_workload(workload_options(**_options("a:2")))


@pytest.mark.parametrize(
    "other", [{"poisson_rate": 2.0}, {"gamma": "2:3"}, {"window": "0:10"}, {"mix": "1:a:b:2"}]
)
def test_other_sources_and_reshaping_are_refused(other: dict[str, Any]) -> None:
    """``--tenant-load`` is its own source: combining it with another is an error."""
    with pytest.raises(ValueError, match="--tenant-load combines only with"):
        build_workload(workload_options(**_options("a:2", **other)))


def test_simulate_runs_tenant_loads(tmp_path: Path) -> None:
    """``sluicegate simulate --tenant-load`` end to end: both tenants appear in the records."""
    config = tmp_path / "sim.yaml"
    config.write_text(
        "models:\n  - name: m\n    lanes:\n      - {name: shared, policy: fair}\n"
        "tenants:\n  - {name: quiet, default_lane: shared}\n"
        "  - {name: noisy, default_lane: shared}\n"
        "simulation: {preset: tiny, replicas: 1}\n",
        encoding="utf-8",
    )
    result = CliRunner().invoke(
        app,
        ["simulate", "--config", str(config), "--trace", str(TRACE), "--duration", "20",
         "--tenant-load", "quiet:1:lane=shared",
         "--tenant-load", "noisy:1:lane=shared:burst=5x5s/10s",
         "--out", str(tmp_path / "out"), "--workers", "1"],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    csv = next((tmp_path / "out").glob("requests-*.csv")).read_text(encoding="utf-8")
    assert ",quiet,shared," in csv
    assert ",noisy,shared," in csv


def test_simulate_refuses_a_bad_tenant_load(tmp_path: Path) -> None:
    """A malformed spec exits 1 with the reason."""
    result = CliRunner().invoke(app, ["simulate", "--tenant-load", "quiet", "--trace", str(TRACE)])
    assert result.exit_code == 1
    assert "TENANT:RATE" in result.output
