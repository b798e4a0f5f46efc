"""TensorRT-LLM-named Prometheus metrics for the emulator, in a registry of its own.

Names, types and labels (``model_name``, ``engine_type``) follow ``MetricsCollector`` in
TensorRT-LLM's tensorrt_llm/metrics/collector.py, as ``trtllm-serve`` serves them on
``/prometheus/metrics``; histogram buckets are that collector's defaults. The real server
uses a multiprocess registry whose gauges also carry a ``pid`` label; this one is a single
process and has none. Gauges are computed from the engine at scrape time; counters and
histograms are fed by the runner.
"""

from __future__ import annotations

from sluicegate.emulator.personalities.labelled_registry import LabelledRegistry, Reading
from sluicegate.emulator.personalities.vllm_metrics import FINISH_REASONS
from sluicegate.engine import Engine

_LABELS = ("model_name", "engine_type")
_TTFT_BUCKETS = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0,
    7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
)  # fmt: skip
_TPOT_BUCKETS = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
    10.0, 20.0, 40.0, 80.0,
)  # fmt: skip
_E2E_BUCKETS = (
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0,
    120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0,
)  # fmt: skip


def _hit_rate(engine: Engine) -> float:
    cache = engine.prefix_cache
    return cache.hit_tokens / cache.query_tokens if cache.query_tokens else 0.0


class TensorRTLLMMetrics(LabelledRegistry):
    """The emulator's metrics as ``trtllm-serve`` names them, labelled
    ``model_name=<model>, engine_type="trtllm"``.

    Gauges: ``trtllm_num_requests_running``, ``trtllm_num_requests_waiting``,
    ``trtllm_kv_cache_utilization`` (0–1), ``trtllm_kv_cache_hit_rate`` and, for an engine
    with a shared KV cache, ``trtllm_kv_cache_max_blocks``, ``trtllm_kv_cache_used_blocks``,
    ``trtllm_kv_cache_free_blocks`` and ``trtllm_kv_cache_tokens_per_block``. Counters:
    ``trtllm_request_success_total{finished_reason}``, ``trtllm_prompt_tokens_total``,
    ``trtllm_generation_tokens_total``. Histograms: ``trtllm_time_to_first_token_seconds``,
    ``trtllm_time_per_output_token_seconds``, ``trtllm_e2e_request_latency_seconds``.

    Args:
        model: the served model name.
        engine: the engine whose state the gauges report.
    """

    def __init__(self, model: str, engine: Engine) -> None:
        super().__init__(_LABELS, (model, "trtllm"))
        self._gauges(engine)
        self._prompt_tokens = self.counter("trtllm_prompt_tokens", "Prompt tokens processed.")
        self._generation_tokens = self.counter(
            "trtllm_generation_tokens", "Generation tokens produced."
        )
        self._success = self.counters_by(
            "trtllm_request_success", "Count of successfully processed requests.",
            "finished_reason", FINISH_REASONS,
        )  # fmt: skip
        self._ttft = self.histogram(
            "trtllm_time_to_first_token_seconds", "Time to first token in seconds.", _TTFT_BUCKETS
        )
        self._tpot = self.histogram(
            "trtllm_time_per_output_token_seconds", "Time per output token in seconds.",
            _TPOT_BUCKETS,
        )  # fmt: skip
        self._e2e = self.histogram(
            "trtllm_e2e_request_latency_seconds", "End to end request latency in seconds.",
            _E2E_BUCKETS,
        )  # fmt: skip

    def _gauges(self, engine: Engine) -> None:
        config = engine.config
        readings: list[Reading] = [
            ("trtllm_num_requests_running", "Number of active requests",
             lambda: float(engine.num_requests_running)),
            ("trtllm_num_requests_waiting", "Number of queued requests",
             lambda: float(engine.num_requests_waiting)),
            ("trtllm_kv_cache_utilization", "KV cache utilization",
             lambda: engine.kv_cache_usage),
            ("trtllm_kv_cache_hit_rate", "KV cache hit rate", lambda: _hit_rate(engine)),
        ]  # fmt: skip
        if not config.batch_independent:  # independent servers model no shared KV cache

            def used() -> float:
                return float(round(engine.kv_cache_usage * config.num_blocks))

            readings += [
                ("trtllm_kv_cache_max_blocks", "Maximum number of KV cache blocks",
                 lambda: float(config.num_blocks)),
                ("trtllm_kv_cache_used_blocks", "Number of used KV cache blocks", used),
                ("trtllm_kv_cache_free_blocks", "Number of free KV cache blocks",
                 lambda: config.num_blocks - used()),
                ("trtllm_kv_cache_tokens_per_block", "Number of tokens per KV cache block",
                 lambda: float(config.block_size)),
            ]  # fmt: skip
        self.gauges(readings)

    def first_token(self, prompt_tokens: int, ttft_s: float) -> None:
        """A request's prompt was processed and its first token delivered after ``ttft_s``."""
        self._prompt_tokens.inc(prompt_tokens)
        self._generation_tokens.inc()
        self._ttft.observe(ttft_s)

    def next_token(self, gap_s: float) -> None:
        """A later token was delivered ``gap_s`` after the request's previous one."""
        self._generation_tokens.inc()
        self._tpot.observe(gap_s)

    def finished(self, reason: str, e2e_s: float | None) -> None:
        """A request ended (``stop``, ``length`` or ``abort``); aborts carry no latency."""
        self._success[reason].inc()
        if e2e_s is not None:
            self._e2e.observe(e2e_s)

    def preempted(self, count: int) -> None:
        """TensorRT-LLM exports no preemption count: nothing to record."""
