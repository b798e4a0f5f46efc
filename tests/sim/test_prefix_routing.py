"""The shared-prefix workload, its routing key, and prefix_affinity vs least_inflight."""

from __future__ import annotations

import pytest

from sluicegate.config import parse_config
from sluicegate.engine import preset
from sluicegate.outcomes import WorkloadRequest
from sluicegate.sim.virtual_driver import simulate
from sluicegate.sim.workload_options import build_workload, workload_options
from sluicegate.sim.workloads.prefix import parse_prefix_workload, shared_prefix

CONFIG = """\
models:
  - name: default
    router: {router}
    max_concurrency: {cap}
    lanes:
      - name: interactive
        max_concurrency: {cap}
simulation:
  preset: llama-3.1-8b-h100
  replicas: {replicas}
"""


def test_requests_of_one_system_prompt_share_its_blocks_and_nothing_else() -> None:
    """Each request's prefix: its system prompt's blocks, then hashes no other request has."""
    requests = shared_prefix(20.0, 30.0, seed=3, prompts=5, blocks=8, block_size=16)
    assert len(requests) > 300
    seen: set[int] = set()
    for r in requests:
        system = int(r.tenant.removeprefix("sys"))
        assert r.prefix[:8] == tuple(range(system * 8, system * 8 + 8))
        assert len(r.prefix) == r.prompt_tokens // 16
        own = set(r.prefix[8:])
        assert not own & seen
        assert min(own, default=40) >= 40
        seen |= own
    assert shared_prefix(20.0, 30.0, seed=3, prompts=5, blocks=8) == requests


def test_zipf_popularity_favours_the_first_prompts() -> None:
    """With zipf 1.1 prompt 0 is the most used and outnumbers the last several times over."""
    requests = shared_prefix(50.0, 60.0, seed=1, prompts=8, blocks=2, zipf=1.1)
    counts = [sum(r.tenant == f"sys{i}" for r in requests) for i in range(8)]
    assert counts[0] == max(counts)
    assert counts[0] > 5 * counts[7]


def test_the_routing_key_comes_from_the_leading_blocks() -> None:
    """Same first four hashes → same prefix_key; a different first block → another; none → None."""
    a = WorkloadRequest(0.0, 100, 1, 1, prefix=(1, 2, 3, 4, 5))
    b = WorkloadRequest(0.0, 100, 1, 1, prefix=(1, 2, 3, 4, 99))
    c = WorkloadRequest(0.0, 100, 1, 1, prefix=(7, 2, 3, 4, 5))
    assert a.prefix_key == b.prefix_key is not None
    assert c.prefix_key != a.prefix_key
    assert WorkloadRequest(0.0, 100, 1, 1).prefix_key is None


def test_the_cli_option_parses_and_refuses() -> None:
    """``RATE:PROMPTS:BLOCKS[:ZIPF]``; anything else names the option."""
    assert parse_prefix_workload("4:16:32") == (4.0, 16, 32, 1.1)
    assert parse_prefix_workload("4:16:32:0.5") == (4.0, 16, 32, 0.5)
    for bad in ("4:16", "a:b:c", "4:16:32:1:2"):
        with pytest.raises(ValueError, match="--prefix-workload"):
            parse_prefix_workload(bad)
    opts = workload_options(
        trace=None, poisson_rate=None, gamma=None, duration_s=10.0, window=None,
        rate_scale=1.0, mix=None, seed=2, prefix_workload="3:4:8",
    )  # fmt: skip
    assert build_workload(opts) == shared_prefix(3.0, 10.0, seed=2, prompts=4, blocks=8)


def hit_rate(router: str, requests: list[WorkloadRequest], replicas: int) -> float:
    """Prefix-cache hit rate over all replicas for one simulated run."""
    config = parse_config(
        CONFIG.format(router=router, replicas=replicas, cap=128 * replicas),
        source="<test>",
        simulation=True,
    )
    result = simulate(
        config.scheduler_spec(), "default", requests, preset(config.simulation.preset),
        replicas, scrape_interval_s=config.simulation.scrape_interval_s,
    )  # fmt: skip
    assert all(r.outcome == "completed" for r in result.records)
    assert result.prompt_tokens_queried == sum(r.prompt_tokens for r in requests)
    return result.prefix_hit_rate


def test_prefix_affinity_hits_the_cache_more_than_least_inflight() -> None:
    """More system prompts than one replica's KV holds: affinity keeps each on one replica."""
    requests = shared_prefix(12.0, 60.0, seed=0, prompts=512, blocks=128, zipf=0.8)
    affinity = hit_rate("prefix_affinity", requests, 2)
    spread = hit_rate("least_inflight", requests, 2)
    assert affinity > spread + 0.05
    assert 0.0 < spread < affinity < 1.0
