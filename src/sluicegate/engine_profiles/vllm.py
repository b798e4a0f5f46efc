"""vLLM (V1 engine, and V0's names where V1 renamed them).

Source: vllm/v1/metrics/loggers.py (``PrometheusStatLogger``) and the V0
vllm/engine/metrics.py; docs.vllm.ai "Production Metrics". V1 reports the KV cache's
use as ``vllm:kv_cache_usage_perc`` (0–1; V0 and early V1: ``vllm:gpu_cache_usage_perc``),
the prefix cache as the counters ``vllm:prefix_cache_queries_total`` and
``vllm:prefix_cache_hits_total`` (tokens; V0: the gauge ``vllm:gpu_prefix_cache_hit_rate``),
and its cache configuration as the info gauge ``vllm:cache_config_info`` whose labels
``num_gpu_blocks`` × ``block_size`` are the KV capacity in tokens (``num_gpu_blocks="None"``
before the GPU is profiled). Errors are ``{"error": {"message", "type", "param", "code"}}``
since 0.10 and ``{"object": "error", "message", "type", "param", "code"}`` before.
``vllm serve --scheduling-policy priority`` orders its waiting queue by the request's
``priority`` (lower first; ties by arrival) and preempts the running request of the
largest value when its KV cache is short.
"""

from __future__ import annotations

from sluicegate.engine_profiles.profile import EngineError, EngineProfile, Reading
from sluicegate.engine_profiles.prometheus_text import Samples

RUNNING = "vllm:num_requests_running"
WAITING = "vllm:num_requests_waiting"
KV_USAGE = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")
CACHE_CONFIG = "vllm:cache_config_info"
PREFIX_QUERIES = "vllm:prefix_cache_queries_total"
PREFIX_HITS = "vllm:prefix_cache_hits_total"
PREFIX_HIT_RATE_V0 = "vllm:gpu_prefix_cache_hit_rate"


def kv_capacity(samples: Samples) -> int | None:
    """``num_gpu_blocks × block_size`` from ``vllm:cache_config_info``; None if either
    label is missing or not a positive integer."""
    for labels, _ in samples.labelled(CACHE_CONFIG):
        try:
            blocks, size = int(labels["num_gpu_blocks"]), int(labels["block_size"])
        except (KeyError, ValueError):
            continue
        if blocks > 0 and size > 0:
            return blocks * size
    return None


def hit_rate(hits: float | None, queries: float | None) -> float | None:
    """``hits / queries`` of two counters; None before any query."""
    if hits is None or not queries:
        return None
    return hits / queries


class VLLMProfile(EngineProfile):
    """vLLM's OpenAI server (``vllm serve``)."""

    name = "vllm"
    summary = "running, waiting, KV usage (V1 and V0 names), KV capacity, prefix-cache hits"
    metric_names = frozenset(
        {RUNNING, WAITING, *KV_USAGE, CACHE_CONFIG, PREFIX_QUERIES, PREFIX_HITS, PREFIX_HIT_RATE_V0}
    )
    priority_field = "priority"

    def read_metrics(self, samples: Samples) -> Reading:
        """Sums over ``model_name`` and ``engine`` labels (data-parallel ranks add up)."""
        running, waiting = samples.total(RUNNING), samples.total(WAITING)
        rate = hit_rate(samples.total(PREFIX_HITS), samples.total(PREFIX_QUERIES))
        return Reading(
            running=None if running is None else int(running),
            waiting=None if waiting is None else int(waiting),
            kv_usage=_mean(samples, KV_USAGE),
            kv_capacity_tokens=kv_capacity(samples),
            prefix_hit_rate=rate if rate is not None else samples.total(PREFIX_HIT_RATE_V0),
        )

    def error_code(self, status: int, error: EngineError) -> str | None:
        """A prompt past the model's context (``maximum context length`` in the message of
        its 400) is ``context_length_exceeded``."""
        if status == 400 and "maximum context length" in (error.message or ""):
            return "context_length_exceeded"
        return None


def _mean(samples: Samples, names: tuple[str, ...]) -> float | None:
    """The mean of the first present gauge over its samples (one per data-parallel engine):
    a fraction does not add up across engines."""
    for name in names:
        values = [value for _, value in samples.by_name.get(name, ())]
        if values:
            return sum(values) / len(values)
    return None


class EmulatorProfile(VLLMProfile):
    """sluicegate's own emulator (``sluicegate emulate``) in its default, vLLM personality."""

    name = "emulator"
    summary = "as vllm (the emulator's default personality)"
