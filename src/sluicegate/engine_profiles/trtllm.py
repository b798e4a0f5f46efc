"""TensorRT-LLM, behind either of its front ends: ``trtllm-serve`` or Triton.

Sources: TensorRT-LLM tensorrt_llm/serve/openai_server.py (routes, ``create_error_response``,
``health``), tensorrt_llm/serve/openai_protocol.py (``ErrorResponse``, the
``priority`` field), tensorrt_llm/metrics/collector.py (``MetricsCollector``), and the Triton
backend's inflight_batcher_llm/src/custom_metrics_reporter/custom_metrics_reporter.cc and
model_instance_state.cc (tensorrtllm_backend v0.18, since moved to TensorRT-LLM's
triton_backend/), with the metrics section of that backend's README.

``trtllm-serve`` answers ``/metrics`` with JSON iteration stats (a list that each GET drains
from the engine's queue), never Prometheus. Its Prometheus page is ``/prometheus/metrics``,
mounted only with ``return_perf_metrics: true``: ``trtllm_`` names from a multiprocess
registry (gauges carry a ``pid`` label). Releases up to 1.1 export only request
histograms and the gauges ``trtllm_kv_cache_utilization`` (used / max blocks) and
``trtllm_kv_cache_hit_rate``; later ones add ``trtllm_num_requests_running`` and
``trtllm_num_requests_waiting`` (the executor's active and queued requests) and the block
gauges ``trtllm_kv_cache_max_blocks`` and ``trtllm_kv_cache_tokens_per_block``. So this
profile's metrics path is ``/prometheus/metrics``; a version without it answers 404 there
and the backend keeps the gateway's own signals.

Triton exports on its own metrics port (8002; set the backend's ``metrics_url``)
``nv_trt_llm_request_metrics{request_type=active|max|scheduled|context|waiting}`` and
``nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type=max|free|used|tokens_per|reused|fraction}``
(``waiting`` = active − scheduled and ``fraction`` = used / max since v0.18; before, the
same are computed here from the other labels). Both front ends' names are read, so one
profile serves either. Health is ``trtllm-serve``'s ``/health`` (503 once the executor
failed); Triton's OpenAI front end has no ``/health``, and its 404 still proves it up.

Errors: ``{"object": "error", "message", "type", "param", "code": <status>}`` (vLLM's
older shape, ``type`` such as ``BadRequestError``); any failure to start a request is a 400;
a body that fails validation is a 400 of ``{"error": "<text>"}``. A non-streamed request's
departed client is noticed within a second (``await_disconnected``). The executor orders its
waiting queue by a ``priority`` in [0, 1] (higher first, default 0.5, with
``scheduler_config.waiting_queue_policy: priority``), but ``trtllm-serve`` takes it on
``/v1/completions`` only and only in recent releases (older ones refuse unknown fields
with a 400), so no priority field is sent.
"""

from __future__ import annotations

import math

from sluicegate.engine_profiles.profile import EngineError, EngineProfile, Reading
from sluicegate.engine_profiles.prometheus_text import Samples

RUNNING = "trtllm_num_requests_running"
WAITING = "trtllm_num_requests_waiting"
KV_UTILIZATION = "trtllm_kv_cache_utilization"
KV_MAX_BLOCKS = "trtllm_kv_cache_max_blocks"
KV_TOKENS_PER_BLOCK = "trtllm_kv_cache_tokens_per_block"
KV_HIT_RATE = "trtllm_kv_cache_hit_rate"
TRITON_REQUESTS = "nv_trt_llm_request_metrics"
TRITON_KV_BLOCKS = "nv_trt_llm_kv_cache_block_metrics"


def _count(value: float | None) -> int | None:
    """A count from a gauge; None if absent or not a finite number."""
    return None if value is None or not math.isfinite(value) else int(value)


def _mean(samples: Samples, name: str, **match: str) -> float | None:
    """The mean of ``name``'s matching samples: a fraction or a block size does not add up
    across processes or model instances."""
    values = [value for _, value in samples.labelled(name, **match)]
    return sum(values) / len(values) if values else None


def _capacity(blocks: float | None, tokens_per_block: float | None) -> int | None:
    """Blocks × tokens per block; None unless both are positive."""
    if blocks is None or tokens_per_block is None:
        return None
    tokens = blocks * tokens_per_block
    if not math.isfinite(tokens) or blocks <= 0 or tokens_per_block <= 0:
        return None
    return int(tokens)


def read_serve(samples: Samples) -> Reading:
    """What ``trtllm-serve``'s ``/prometheus/metrics`` says."""
    return Reading(
        running=_count(samples.total(RUNNING)),
        waiting=_count(samples.total(WAITING)),
        kv_usage=_mean(samples, KV_UTILIZATION),
        kv_capacity_tokens=_capacity(
            samples.total(KV_MAX_BLOCKS), _mean(samples, KV_TOKENS_PER_BLOCK)
        ),
        prefix_hit_rate=_mean(samples, KV_HIT_RATE),
    )


def read_triton(samples: Samples) -> Reading:
    """What Triton's metrics page says: scheduled requests run, the rest of the active ones
    wait (the backend's own ``waiting`` where it reports it)."""
    active = samples.total(TRITON_REQUESTS, request_type="active")
    scheduled = samples.total(TRITON_REQUESTS, request_type="scheduled")
    waiting = samples.total(TRITON_REQUESTS, request_type="waiting")
    if waiting is None and active is not None and scheduled is not None:
        waiting = max(0.0, active - scheduled)
    blocks = samples.total(TRITON_KV_BLOCKS, kv_cache_block_type="max")
    usage = _mean(samples, TRITON_KV_BLOCKS, kv_cache_block_type="fraction")
    used = samples.total(TRITON_KV_BLOCKS, kv_cache_block_type="used")
    if usage is None and used is not None and blocks:
        usage = used / blocks
    return Reading(
        running=_count(scheduled),
        waiting=_count(waiting),
        kv_usage=usage,
        kv_capacity_tokens=_capacity(
            blocks, _mean(samples, TRITON_KV_BLOCKS, kv_cache_block_type="tokens_per")
        ),
    )


class TensorRTLLMProfile(EngineProfile):
    """TensorRT-LLM: ``trtllm-serve`` (its paths) or Triton (``metrics_url`` to port 8002)."""

    name = "trtllm"
    summary = (
        "running, waiting, KV usage and capacity (blocks × tokens per block), KV hit rate: "
        "trtllm-serve's trtllm_* or Triton's nv_trt_llm_* (metrics_url)"
    )
    metrics_path = "/prometheus/metrics"
    metric_names = frozenset(
        {
            RUNNING,
            WAITING,
            KV_UTILIZATION,
            KV_MAX_BLOCKS,
            KV_TOKENS_PER_BLOCK,
            KV_HIT_RATE,
            TRITON_REQUESTS,
            TRITON_KV_BLOCKS,
        }
    )

    def read_metrics(self, samples: Samples) -> Reading:
        """Triton's names where the page has them, else ``trtllm-serve``'s."""
        if TRITON_REQUESTS in samples or TRITON_KV_BLOCKS in samples:
            return read_triton(samples)
        return read_serve(samples)

    def read_error(self, answer: dict[str, object]) -> EngineError:
        """Also a validation failure's ``{"error": "<text>"}``."""
        error = answer.get("error")
        if isinstance(error, str):
            return EngineError(error)
        return super().read_error(answer)

    def error_code(self, status: int, error: EngineError) -> str | None:
        """A prompt past the engine's limits is ``context_length_exceeded``: the LLM API's
        argument check (tensorrt_llm/llmapi/llm.py ``_check_arguments``) says the prompt
        "should not exceed" ``max_num_tokens`` or ``max_seq_len``."""
        message = error.message or ""
        if status == 400 and "should not exceed" in message and "max_" in message:
            return "context_length_exceeded"
        return None
