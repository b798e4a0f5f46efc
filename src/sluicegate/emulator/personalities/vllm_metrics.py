"""vLLM-named Prometheus metrics for the emulator, in a registry of its own.

Names, types, labels (``model_name``, ``engine``) and histogram buckets follow
vLLM v1's ``PrometheusStatLogger`` (vllm/v1/metrics/loggers.py), so a scraper
written for vLLM reads the emulator unchanged. Gauges are computed from the
engine at scrape time; counters and histograms are fed by the runner.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import Gauge
from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector

from sluicegate.emulator.personalities.labelled_registry import LabelledRegistry
from sluicegate.engine import Engine

FINISH_REASONS: tuple[str, ...] = ("stop", "length", "abort")

_LABELS = ("model_name", "engine")
_TTFT_BUCKETS = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0,
    7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
)  # fmt: skip
_ITL_BUCKETS = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
    10.0, 20.0, 40.0, 80.0,
)  # fmt: skip
_E2E_BUCKETS = (
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0,
    120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0,
)  # fmt: skip


class _PrefixCacheCounters(Collector):
    """``vllm:prefix_cache_queries_total`` and ``vllm:prefix_cache_hits_total`` (tokens),
    read from the engine's prefix cache at scrape time."""

    def __init__(self, values: tuple[str, ...], engine: Engine) -> None:
        self._values, self._engine = values, engine

    def collect(self) -> Iterator[CounterMetricFamily]:
        cache = self._engine.prefix_cache
        for name, doc, value in (
            ("vllm:prefix_cache_queries",
             "Prefix cache queries, in terms of number of queried tokens.", cache.query_tokens),
            ("vllm:prefix_cache_hits",
             "Prefix cache hits, in terms of number of cached tokens.", cache.hit_tokens),
        ):  # fmt: skip
            family = CounterMetricFamily(name, doc, labels=list(_LABELS))
            family.add_metric(list(self._values), float(value))
            yield family


class EmulatorMetrics(LabelledRegistry):
    """The emulator's Prometheus metrics, labelled ``model_name=<model>, engine="0"``.

    Gauges: ``vllm:num_requests_running``, ``vllm:num_requests_waiting``,
    ``vllm:kv_cache_usage_perc`` and its deprecated twin
    ``vllm:gpu_cache_usage_perc`` (0–1), and ``vllm:cache_config_info`` (1, with
    the engine's ``block_size`` and ``num_gpu_blocks`` as labels; not for a
    ``batch_independent`` engine, which has no shared KV cache). Counters:
    ``vllm:prompt_tokens_total``, ``vllm:generation_tokens_total``, ``vllm:num_preemptions_total``,
    ``vllm:request_success_total{finished_reason}``, ``vllm:prefix_cache_queries_total`` and
    ``vllm:prefix_cache_hits_total`` (prompt tokens looked up in and saved by the prefix
    cache; only prompts of at least one full KV block look it up). Histograms:
    ``vllm:time_to_first_token_seconds``, ``vllm:inter_token_latency_seconds``,
    ``vllm:time_per_output_token_seconds`` (the same per-token gaps, its older
    name) and ``vllm:e2e_request_latency_seconds``.

    Args:
        model: the served model name.
        engine: the engine whose state the gauges report.
    """

    def __init__(self, model: str, engine: Engine) -> None:
        super().__init__(_LABELS, (model, "0"))
        self._gauges(engine)
        self.registry.register(_PrefixCacheCounters(self.values, engine))
        self._prompt_tokens = self.counter("vllm:prompt_tokens", "Prefill tokens processed.")
        self._generation_tokens = self.counter(
            "vllm:generation_tokens", "Generation tokens processed."
        )
        self._preemptions = self.counter(
            "vllm:num_preemptions", "Cumulative number of preemptions from the engine."
        )
        self._success = self.counters_by(
            "vllm:request_success", "Count of successfully processed requests.",
            "finished_reason", FINISH_REASONS,
        )  # fmt: skip
        self._ttft = self.histogram(
            "vllm:time_to_first_token_seconds", "Time to first token in seconds.", _TTFT_BUCKETS
        )
        self._itl = self.histogram(
            "vllm:inter_token_latency_seconds", "Inter-token latency in seconds.", _ITL_BUCKETS
        )
        self._tpot = self.histogram(
            "vllm:time_per_output_token_seconds", "Time per output token in seconds.", _ITL_BUCKETS
        )
        self._e2e = self.histogram(
            "vllm:e2e_request_latency_seconds", "End-to-end request latency in seconds.",
            _E2E_BUCKETS,
        )  # fmt: skip

    def _gauges(self, engine: Engine) -> None:
        readings = (
            ("vllm:num_requests_running", "Requests in model execution batches.",
             lambda: float(engine.num_requests_running)),
            ("vllm:num_requests_waiting", "Requests waiting to be processed.",
             lambda: float(engine.num_requests_waiting)),
            ("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.",
             lambda: engine.kv_cache_usage),
            ("vllm:gpu_cache_usage_perc",
             "GPU KV-cache usage. 1 means 100 percent usage. "
             "DEPRECATED: Use vllm:kv_cache_usage_perc instead.",
             lambda: engine.kv_cache_usage),
        )  # fmt: skip
        self.gauges(readings)
        config = engine.config
        if config.batch_independent:
            return  # independent servers model no shared KV cache to report
        info = Gauge(
            "vllm:cache_config_info",
            "Information of the LLMEngine CacheConfig",
            ["engine", "block_size", "num_gpu_blocks"],
            registry=self.registry,
        )
        info.labels("0", str(config.block_size), str(config.num_blocks)).set(1.0)

    def first_token(self, prompt_tokens: int, ttft_s: float) -> None:
        """A request's prompt was processed and its first token delivered after ``ttft_s``."""
        self._prompt_tokens.inc(prompt_tokens)
        self._generation_tokens.inc()
        self._ttft.observe(ttft_s)

    def next_token(self, gap_s: float) -> None:
        """A later token was delivered ``gap_s`` after the request's previous one."""
        self._generation_tokens.inc()
        self._itl.observe(gap_s)
        self._tpot.observe(gap_s)

    def finished(self, reason: str, e2e_s: float | None) -> None:
        """A request ended (``stop``, ``length`` or ``abort``); aborts carry no latency."""
        self._success[reason].inc()
        if e2e_s is not None:
            self._e2e.observe(e2e_s)

    def preempted(self, count: int) -> None:
        """The engine preempted ``count`` requests in a step."""
        if count:
            self._preemptions.inc(count)
