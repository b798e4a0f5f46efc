"""SGLang-named Prometheus metrics for the emulator, in a registry of its own.

Names, types and labels follow SGLang's ``SchedulerMetricsCollector`` and
``TokenizerMetricsCollector`` (python/sglang/srt/metrics/collector.py): scheduler gauges
labelled ``model_name, engine_type, tp_rank, pp_rank`` (one scheduler: ranks "0"),
tokenizer counters and histograms labelled ``model_name``. Gauges and token counters
are read from the engine at scrape time; the request counters and histograms are fed
by the runner. ``sglang:cache_hit_rate`` here is the hit rate since start (SGLang's is
its last prefill batch's).
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import Gauge
from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector

from sluicegate.emulator.personalities.labelled_registry import LabelledRegistry
from sluicegate.engine import Engine

SCHEDULER_LABELS = ("model_name", "engine_type", "tp_rank", "pp_rank")
_TTFT_BUCKETS = (
    0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400,
)  # fmt: skip
_ITL_BUCKETS = (
    0.002, 0.004, 0.006, 0.008, 0.010, 0.015, 0.020, 0.025, 0.030, 0.035, 0.040, 0.060,
    0.080, 0.100, 0.200, 0.400, 0.600, 0.800, 1.0, 2.0, 4.0, 6.0, 8.0,
)  # fmt: skip
_E2E_BUCKETS = (
    0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400, 600,
    1200, 1800, 2400,
)  # fmt: skip


class _TokenCounters(Collector):
    """``sglang:prompt_tokens_total``, ``sglang:cached_tokens_total`` and
    ``sglang:generation_tokens_total``, read from the engine's own counters."""

    def __init__(self, model: str, engine: Engine) -> None:
        self._model, self._engine = model, engine

    def collect(self) -> Iterator[CounterMetricFamily]:
        cache, model = self._engine.prefix_cache, [self._model]
        for name, doc, value in (
            ("sglang:prompt_tokens", "Number of prefill tokens processed.", cache.query_tokens),
            ("sglang:cached_tokens", "Number of cached prompt tokens.", cache.hit_tokens),
            ("sglang:generation_tokens", "Number of generation tokens processed.",
             self._engine.generation_tokens_total),
        ):  # fmt: skip
            family = CounterMetricFamily(name, doc, labels=["model_name"])
            family.add_metric(model, float(value))
            yield family


class SGLangMetrics(LabelledRegistry):
    """The emulator's metrics under SGLang's names (see the module docstring).

    Args:
        model: the served model name.
        engine: the engine whose state the gauges report.
    """

    def __init__(self, model: str, engine: Engine) -> None:
        super().__init__(("model_name",), (model,))
        self._scheduler_gauges(model, engine)
        self.registry.register(_TokenCounters(model, engine))
        self._requests = self.counter("sglang:num_requests", "Number of requests processed.")
        self._aborted = self.counter("sglang:num_aborted_requests", "Number of requests aborted.")
        self._ttft = self.histogram("sglang:time_to_first_token_seconds",
            "Histogram of time to first token in seconds.", _TTFT_BUCKETS,
        )  # fmt: skip
        self._itl = self.histogram("sglang:inter_token_latency_seconds",
            "Histogram of inter-token latency in seconds.", _ITL_BUCKETS,
        )  # fmt: skip
        self._e2e = self.histogram("sglang:e2e_request_latency_seconds",
            "Histogram of End-to-end request latency in seconds", _E2E_BUCKETS,
        )  # fmt: skip

    def _scheduler_gauges(self, model: str, engine: Engine) -> None:
        config = engine.config
        capacity = float(config.num_blocks * config.block_size)
        readings = [
            ("sglang:num_running_reqs", "The number of running requests.",
             lambda: float(engine.num_requests_running)),
            ("sglang:num_queue_reqs", "The number of requests in the waiting queue.",
             lambda: float(engine.num_requests_waiting)),
            ("sglang:token_usage", "The token usage.", lambda: engine.kv_cache_usage),
            ("sglang:cache_hit_rate", "The prefix cache hit rate.",
             lambda: engine.prefix_cache.hit_rate),
        ]  # fmt: skip
        if not config.batch_independent:  # independent servers model no shared KV pool
            readings.append(
                ("sglang:max_total_num_tokens",
                 "Maximum total number of tokens in the KV cache pool.", lambda: capacity)
            )  # fmt: skip
        for name, doc, read in readings:
            gauge = Gauge(name, doc, SCHEDULER_LABELS, registry=self.registry)
            gauge.labels(model, "unified", "0", "0").set_function(read)

    def first_token(self, prompt_tokens: int, ttft_s: float) -> None:
        """A request's first token came after ``ttft_s``."""
        self._ttft.observe(ttft_s)

    def next_token(self, gap_s: float) -> None:
        """A later token came ``gap_s`` after the previous one."""
        self._itl.observe(gap_s)

    def finished(self, reason: str, e2e_s: float | None) -> None:
        """A request ended; aborts are also counted as aborted and carry no latency."""
        self._requests.inc()
        if reason == "abort":
            self._aborted.inc()
        if e2e_s is not None:
            self._e2e.observe(e2e_s)

    def preempted(self, count: int) -> None:
        """SGLang exports no cumulative preemption counter that this emulator plays."""
