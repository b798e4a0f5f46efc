"""Prefix-cache hit rates per replica, in tokens and requests: on the result, in
results.json and in the simulate tables; absent where nothing was looked up."""

from __future__ import annotations

import json
from pathlib import Path

from rich.console import Console

from sluicegate.config import parse_config
from sluicegate.engine import preset
from sluicegate.engine.prefix_cache import PrefixCache
from sluicegate.outcomes import WorkloadRequest
from sluicegate.sim.comparison import run_comparison
from sluicegate.sim.prefix_hits import PrefixCounts, prefix_table
from sluicegate.sim.virtual_driver import simulate
from sluicegate.sim.workloads import poisson

CONFIG = """\
models:
  - name: default
simulation:
  preset: llama-3.1-8b-h100
  replicas: {replicas}
"""


def test_the_cache_counts_requests_that_hit() -> None:
    """An admission counts as a request; it hits when any token was cached."""
    cache = PrefixCache()
    cache.count(100, 0, 10)
    cache.count(100, 16, 10)
    cache.count(50, 48, 10)
    assert (cache.query_requests, cache.hit_requests) == (3, 2)
    assert PrefixCounts.of(cache) == PrefixCounts(250, 64, 3, 2)


def test_totals_and_rates() -> None:
    """Counts add up; rates are None without lookups."""
    total = PrefixCounts.total([PrefixCounts(100, 50, 2, 1), PrefixCounts(300, 0, 3, 0)])
    assert total == PrefixCounts(400, 50, 5, 1)
    assert (total.token_hit_rate, total.request_hit_rate) == (0.125, 0.2)
    assert PrefixCounts().token_hit_rate is None
    assert PrefixCounts().request_hit_rate is None


def sequential(prefixes: list[tuple[int, ...]]) -> list[WorkloadRequest]:
    """64-token prompts 5 s apart (each done before the next), with these block hashes."""
    return [WorkloadRequest(5.0 * i, 64, 4, 4, prefix=p) for i, p in enumerate(prefixes)]


def test_a_run_reports_hits_per_replica() -> None:
    """Three prompts on one replica: the 2nd shares two blocks, the 3rd none; the counts per
    replica sum to the result's totals."""
    config = parse_config(CONFIG.format(replicas=1), source="<t>", simulation=True)
    workload = sequential([(1, 2, 3, 4), (1, 2, 8, 9), (5, 6, 7, 10)])
    result = simulate(config.scheduler_spec(), "default", workload, preset("llama-3.1-8b-h100"), 1)
    assert result.prefix_by_replica == {"r0": PrefixCounts(192, 32, 3, 1)}
    assert (result.prompt_tokens_queried, result.prompt_tokens_cached) == (192, 32)
    assert result.prefix_request_hit_rate == 1 / 3


def test_results_json_and_tables_carry_hits_only_when_looked_up(tmp_path: Path) -> None:
    """A prefix workload's results.json has prefix_cache with every replica, and the tables
    a hits table; a workload without hashes has neither."""
    config = parse_config(CONFIG.format(replicas=2), source="<t>", simulation=True)
    workload = sequential([(1, 2, 3, 4)] * 6)
    console = Console(record=True, width=120)
    done = run_comparison(config, workload, ["config"], out_dir=tmp_path / "a", console=console,
                          workers=1)  # fmt: skip
    prefix = json.loads(done.json_path.read_text())["policies"]["config"]["prefix_cache"]
    assert sorted(prefix["replicas"]) == ["r0", "r1"]
    assert prefix["requests"] == 6
    assert prefix["queried_tokens"] == 6 * 64
    per = prefix["replicas"]
    assert sum(r["hit_requests"] for r in per.values()) == prefix["hit_requests"] >= 4
    assert prefix["token_hit_rate"] == round(prefix["cached_tokens"] / (6 * 64), 6)
    assert "tokens / requests" in console.export_text()
    plain = poisson(2.0, 10.0, seed=1)
    quiet = Console(record=True, width=120)
    other = run_comparison(config, plain, ["config"], out_dir=tmp_path / "b", console=quiet,
                           workers=1)  # fmt: skip
    assert "prefix_cache" not in other.json_path.read_text()
    assert "prefix cache hits" not in quiet.export_text()


def test_the_table_has_all_then_each_replica() -> None:
    """Rows: all, then each replica; a cell is tokens / requests hit; None without lookups."""
    runs = [{"r0": PrefixCounts(100, 50, 4, 3), "r1": PrefixCounts(100, 0, 4, 0)}]
    table = prefix_table(["config"], runs)
    assert table is not None
    console = Console(record=True, width=80)
    console.print(table)
    text = console.export_text()
    assert "25.0% / 37.5%" in text
    assert "50.0% / 75.0%" in text
    assert "0.0% / 0.0%" in text
    assert prefix_table(["config"], [{"r0": PrefixCounts()}]) is None
