"""The gateway learns the ``auto`` token budget from vLLM's ``vllm:cache_config_info`` (§5)."""

from __future__ import annotations

import pytest

from sluicegate.core.spec import KV_WATERMARK
from sluicegate.emulator.personalities.vllm_metrics import EmulatorMetrics
from sluicegate.engine import Engine, preset
from sluicegate.engine_profiles import profile
from sluicegate.gateway.ops.scrape import parse_engine_metrics, stats_from
from tests.gateway.gateway_harness import model_state, stack, wait_until

TINY_KV = preset("tiny").num_blocks * preset("tiny").block_size  # 32,768
FAST = "server: {scrape_interval_s: 0.05}\n"
VLLM = profile("vllm")

# As vLLM v1 renders it: every CacheConfig field is a label (abridged).
VLLM_INFO = """# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="16",cache_dtype="auto",enable_prefix_caching="True",\
engine="0",gpu_memory_utilization="0.9",num_cpu_blocks="None",num_gpu_blocks="%s",\
swap_space="4"} 1.0
"""


@pytest.mark.parametrize(
    ("blocks", "capacity"), [("28000", 448_000), ("None", None), ("0", None), ("x", None)]
)
def test_cache_config_info_gives_capacity(blocks: str, capacity: int | None) -> None:
    """``num_gpu_blocks × block_size`` becomes ``kv_capacity_tokens``; an unknown (vLLM's
    ``"None"`` before profiling), zero or malformed block count leaves it unknown."""
    stats = stats_from("m", "b", parse_engine_metrics(VLLM, VLLM_INFO % blocks))
    assert stats.kv_capacity_tokens == capacity


def test_scrape_without_cache_config_leaves_capacity_unknown() -> None:
    """An engine that does not expose the cache configuration reports no capacity."""
    text = "# TYPE vllm:kv_cache_usage_perc gauge\nvllm:kv_cache_usage_perc 0.5\n"
    stats = stats_from("m", "b", parse_engine_metrics(VLLM, text))
    assert stats.kv_capacity_tokens is None
    assert stats.kv_cache_usage == 0.5


def test_default_config_derives_budget_from_scraped_engines() -> None:
    """With two emulated engines and no ``max_inflight_tokens``, ``/admin/state`` shows
    0.9 × the sum of their KV capacities once they are scraped."""
    expected = int(2 * TINY_KV * KV_WATERMARK)
    with stack(FAST, engines=2) as live:
        assert wait_until(
            lambda: model_state(live.base_url)["max_inflight_tokens"] == expected, 5.0
        ), model_state(live.base_url)


@pytest.mark.parametrize(("setting", "budget"), [("1234", 1234), ("off", None), ("null", None)])
def test_configured_budget_is_not_replaced(setting: str, budget: int | None) -> None:
    """A configured number, ``off`` or ``null`` stays as configured after scrapes."""
    with stack(f"    max_inflight_tokens: {setting}\n{FAST}") as live:
        assert not wait_until(
            lambda: model_state(live.base_url)["max_inflight_tokens"] != budget, 0.5
        )


def test_emulator_of_independent_servers_reports_no_cache_config() -> None:
    """The emulator publishes ``vllm:cache_config_info`` only for an engine with a shared KV
    cache: the ``tiny`` preset's 2,048 blocks of 16, nothing for ``independent``."""
    tiny = parse_engine_metrics(
        VLLM, EmulatorMetrics("m", Engine(preset("tiny"))).render().decode()
    )
    assert stats_from("m", "b", tiny).kv_capacity_tokens == TINY_KV == 32_768
    text = EmulatorMetrics("m", Engine(preset("independent"))).render().decode()
    assert stats_from("m", "b", parse_engine_metrics(VLLM, text)).kv_capacity_tokens is None
