"""The scan of an engine's ``/metrics`` (``engine_profiles.prometheus_text.scan``) on the
forms Prometheus text takes, checked against prometheus-client's own parser where that
parser reads the form; and what the vLLM and llama-server profiles read through it."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from sluicegate.emulator.personalities.vllm_metrics import EmulatorMetrics
from sluicegate.engine import Engine, preset
from sluicegate.engine_profiles import profile, scan
from sluicegate.engine_profiles.llama_server import KV_USAGE as LLAMA_KV_USAGE
from sluicegate.engine_profiles.vllm import KV_USAGE, RUNNING, WAITING
from sluicegate.gateway.ops.scrape import parse_engine_metrics, stats_from

WANTED = profile("vllm").metric_names | profile("llama-server").metric_names


def _sums(text: str) -> dict[str, float]:
    """The scan's sum per wanted name."""
    found = scan(text, WANTED)
    return {name: total for name in found.by_name if (total := found.total(name)) is not None}


def _reference(text: str) -> dict[str, float]:
    """The wanted sums as prometheus-client's parser reads ``text``."""
    found: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in (RUNNING, WAITING):
                found[sample.name] = found.get(sample.name, 0.0) + sample.value
    return found


def test_the_emulators_exposition_reads_as_prometheus_client_reads_it() -> None:
    """Every wanted sum of the emulator's own exposition equals prometheus-client's."""
    text = EmulatorMetrics("m", Engine(preset("llama-3.1-8b-h100"))).render().decode()
    found = _sums(text)
    reference = _reference(text)
    assert reference
    assert {k: found[k] for k in reference} == reference


@pytest.mark.parametrize(
    "line",
    [
        'vllm:num_requests_running{model_name="m"} 3',
        'vllm:num_requests_running{model_name="m"}\t3',
        '  vllm:num_requests_running{model_name="m"} 3',
        'vllm:num_requests_running {model_name="m"} 3',
        'vllm:num_requests_running{model_name="a \\"}\\" b"} 3',
        'vllm:num_requests_running{model_name="m"} 3 1700000000000',
        "vllm:num_requests_running 3",
        "vllm:num_requests_running\t3",
    ],
)
def test_sample_forms_prometheus_client_accepts(line: str) -> None:
    """Tabs, leading blanks, a blank before the labels, escaped quotes and braces in a
    label value, a timestamp: the value is read as prometheus-client reads it."""
    assert _reference(line + "\n") == {RUNNING: 3.0}
    assert _sums(line + "\n") == {RUNNING: 3.0}


@pytest.mark.parametrize(
    "line",
    [
        'vllm:num_requests_running{model_name="m"} 3 # {trace_id="abc"} 1.0',
        'vllm:num_requests_running{model_name="m"} 3 1700000000 # {trace_id="x}"} 1.0 17',
        'vllm:num_requests_running 3 # {trace_id="abc"} 1.0',
    ],
)
def test_an_openmetrics_exemplar_is_not_the_value(line: str) -> None:
    """An exemplar after the value (OpenMetrics) is dropped, not read as the sample."""
    assert _sums(line + "\n# EOF\n") == {RUNNING: 3.0}


def test_nan_and_infinities_are_values() -> None:
    """``NaN``, ``+Inf`` and ``-Inf`` are numbers in the format."""
    found = _sums('vllm:num_requests_running{a="1"} NaN\nvllm:num_requests_waiting +Inf\n')
    assert math.isnan(found[RUNNING])
    assert found["vllm:num_requests_waiting"] == math.inf


def test_lines_that_are_not_samples_are_skipped_not_fatal() -> None:
    """A stray line amid samples costs only itself: the samples around it count."""
    text = "vllm:num_requests_running 2\nthis is not a sample\nvllm:num_requests_running 1\n"
    assert _sums(text) == {RUNNING: 3.0}


@pytest.mark.parametrize(
    "body", ["<html><body>Not Found</body></html>", "Not Found", '{"error": 1}']
)
def test_a_body_with_no_sample_at_all_is_not_prometheus_text(body: str) -> None:
    """A body in which no line is a sample raises ``ValueError`` (the engine has no
    usable ``/metrics``); comments and blank lines alone are an empty exposition."""
    with pytest.raises(ValueError, match="not Prometheus text"):
        _sums(body)
    assert _sums("# HELP x y\n\n# TYPE x gauge\n") == {}


def test_the_kv_capacity_is_read_from_the_cache_config_labels() -> None:
    """``vllm:cache_config_info``'s ``num_gpu_blocks`` × ``block_size``, in any label
    order and with other labels holding braces."""
    text = 'vllm:cache_config_info{x="}{",block_size="16",num_gpu_blocks="1000"} 1.0\n'
    assert parse_engine_metrics(profile("vllm"), text).kv_capacity_tokens == 16000


# What ``llama-server --parallel 4 --metrics`` (built from llama-cpp-python 0.3.36) answered
# at /metrics with 4 requests running and 4 more waiting for a slot.
LLAMA_SERVER_METRICS = Path(__file__).parent / "fixtures" / "llama-server" / "metrics.prom"
LLAMA = profile("llama-server")


def test_llama_servers_exposition_gives_running_and_waiting_and_no_kv_usage() -> None:
    """llama-server's busy slots (``llamacpp:requests_processing``) and its own queue
    (``llamacpp:requests_deferred``) become the backend's running and waiting counts, as
    prometheus-client reads them; it exports no KV-cache gauge, so the usage stays unknown."""
    text = LLAMA_SERVER_METRICS.read_text()
    assert _sums(text) == {"llamacpp:requests_processing": 4.0, "llamacpp:requests_deferred": 4.0}
    families = {family.name for family in text_string_to_metric_families(text)}
    assert not families & {*KV_USAGE, LLAMA_KV_USAGE}
    stats = stats_from("tiny", "llama-0", parse_engine_metrics(LLAMA, text), healthy=True)
    assert (stats.num_requests_running, stats.num_requests_waiting) == (4, 4)
    assert stats.kv_cache_usage is None
    assert stats.kv_capacity_tokens is None


def test_an_older_llama_servers_kv_usage_ratio_is_read() -> None:
    """Builds before llama.cpp's KV-cache rewrite exported ``llamacpp:kv_cache_usage_ratio``:
    it is still the backend's KV usage when present."""
    text = LLAMA_SERVER_METRICS.read_text() + "llamacpp:kv_cache_usage_ratio 0.25\n"
    assert stats_from("tiny", "llama-0", parse_engine_metrics(LLAMA, text)).kv_cache_usage == 0.25
