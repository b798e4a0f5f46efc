"""The B2B workload: customers' long shared contexts, short questions, Zipf popularity,
Poisson or bursty arrivals, and its CLI option."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from sluicegate.cli import app
from sluicegate.sim.workload_options import build_workload, workload_options
from sluicegate.sim.workloads.b2b import b2b, parse_b2b_workload


def test_requests_of_one_customer_share_its_context_blocks_and_nothing_else() -> None:
    """A request's prefix: its customer's 375 context blocks (6000 tokens), then hashes no
    other request has; all the prompt's full blocks; the tenant names the customer."""
    requests = b2b(10.0, 60.0, seed=4, customers=20, context_tokens=6000)
    assert len(requests) > 450
    seen: set[int] = set()
    for r in requests:
        customer = int(r.tenant.removeprefix("cust"))
        assert 0 <= customer < 20
        assert r.prefix[:375] == tuple(range(customer * 375, customer * 375 + 375))
        assert len(r.prefix) == r.prompt_tokens // 16
        assert r.prompt_tokens - 6000 >= 8  # a question of at least 8 tokens
        own = set(r.prefix[375:])
        assert not own & seen
        assert min(own, default=20 * 375) >= 20 * 375
        seen |= own
    assert b2b(10.0, 60.0, seed=4, customers=20, context_tokens=6000) == requests


def test_a_context_cut_mid_block_shares_only_its_full_blocks() -> None:
    """A 100-token context: 6 shared blocks; the block the question completes is the
    request's own."""
    requests = b2b(5.0, 30.0, seed=1, customers=3, context_tokens=100)
    by_customer: dict[str, set[int]] = {}
    for r in requests:
        assert r.prefix[:6] == tuple(range(int(r.tenant[4:]) * 6, int(r.tenant[4:]) * 6 + 6))
        by_customer.setdefault(r.tenant, set()).add(r.prefix[6])
    assert all(len(firsts) > 1 for firsts in by_customer.values())


def test_zipf_popularity_favours_the_first_customers() -> None:
    """With zipf 1.1 customer 0 is the busiest and outnumbers customer 9 several times over;
    with zipf 0 they are even."""
    skewed = b2b(50.0, 60.0, seed=2, customers=10, context_tokens=64)
    counts = [sum(r.tenant == f"cust{i}" for r in skewed) for i in range(10)]
    assert counts[0] == max(counts)
    assert counts[0] > 5 * counts[9]
    flat = b2b(50.0, 60.0, seed=2, customers=10, context_tokens=64, zipf=0.0)
    even = [sum(r.tenant == f"cust{i}" for r in flat) for i in range(10)]
    assert max(even) < 1.4 * min(even)


def test_burst_sets_the_arrivals_coefficient_of_variation() -> None:
    """BURST 1 is Poisson (gap CV ≈ 1); BURST 3 gives gaps with CV ≈ 3 at the same rate."""

    def gaps_cv_and_rate(burst: float) -> tuple[float, float]:
        times = np.array([r.arrival_s for r in b2b(20.0, 600.0, seed=5, burst=burst)])
        gaps = np.diff(times)
        return float(gaps.std() / gaps.mean()), len(times) / 600.0

    cv, rate = gaps_cv_and_rate(1.0)
    assert abs(cv - 1.0) < 0.1
    assert abs(rate - 20.0) < 1.0
    cv, rate = gaps_cv_and_rate(3.0)
    assert abs(cv - 3.0) < 0.6
    assert abs(rate - 20.0) < 3.0


def test_bad_arguments_are_refused() -> None:
    """Out-of-range customers, context or zipf are refused naming them."""
    with pytest.raises(ValueError, match="customers, context_tokens"):
        b2b(1.0, 10.0, seed=0, customers=0)
    with pytest.raises(ValueError, match="zipf"):
        b2b(1.0, 10.0, seed=0, zipf=-1.0)
    with pytest.raises(ValueError, match="cv must be"):
        b2b(1.0, 10.0, seed=0, burst=0.0)


def test_the_cli_option_parses_and_refuses() -> None:
    """``RATE:CUSTOMERS:CONTEXT_TOKENS[:ZIPF[:BURST]]``; anything else names the option; it
    excludes the other sources."""
    assert parse_b2b_workload("4:150:6000") == (4.0, 150, 6000, 1.1, 1.0)
    assert parse_b2b_workload("4:150:6000:0.8:2.5") == (4.0, 150, 6000, 0.8, 2.5)
    for bad in ("4:150", "a:b:c", "4:150:6000:1:2:3", "4:1.5:6000"):
        with pytest.raises(ValueError, match="--b2b-workload"):
            parse_b2b_workload(bad)
    opts = workload_options(
        trace=None, poisson_rate=None, gamma=None, duration_s=10.0, window=None,
        rate_scale=1.0, mix=None, seed=2, b2b_workload="3:4:512:1.1:2",
    )  # fmt: skip
    expected = b2b(3.0, 10.0, seed=2, customers=4, context_tokens=512, burst=2.0)
    assert build_workload(opts) == expected
    both = workload_options(
        trace=None, poisson_rate=1.0, gamma=None, duration_s=10.0, window=None,
        rate_scale=1.0, mix=None, seed=2, b2b_workload="3:4:512",
    )  # fmt: skip
    with pytest.raises(ValueError, match=r"exactly one of .* or --b2b-workload"):
        build_workload(both)


def test_simulate_runs_it_and_reports_hits(tmp_path: Path) -> None:
    """``simulate --b2b-workload`` runs and its results carry prefix-cache hit rates; of
    its 20 customers the 12 busiest get tables, the rest only a note."""
    out = tmp_path / "out"
    args = ["simulate", "--b2b-workload", "4:20:2048:0", "--duration", "30", "--replicas", "2",
            "--out", str(out), "--workers", "1"]  # fmt: skip
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "prefix cache hits" in result.output
    assert result.output.count("tenant cust") == 12
    assert "8 quieter tenants" in result.output
    tenants = json.loads((out / "results.json").read_text())["policies"]["config"]["tenants"]
    assert len(tenants) == 20
    prefix = json.loads((out / "results.json").read_text())["policies"]["config"]["prefix_cache"]
    assert sorted(prefix["replicas"]) == ["r0", "r1"]
    assert 0.5 < prefix["token_hit_rate"] < 1.0
