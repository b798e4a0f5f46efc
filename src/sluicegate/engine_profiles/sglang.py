"""SGLang's OpenAI server (``python -m sglang.launch_server --enable-metrics``).

Source: python/sglang/srt/metrics/collector.py (``SchedulerMetricsCollector``,
``TokenizerMetricsCollector``), python/sglang/srt/managers/scheduler_metrics_mixin.py
(the labels), python/sglang/srt/entrypoints/http_server.py (``/health``,
``/health_generate``, ``/get_server_info``), python/sglang/srt/entrypoints/openai/
serving_base.py (error bodies) and python/sglang/srt/server_args.py (priority flags).

``/metrics`` exists only with ``--enable-metrics``. Each scheduler exports the gauges
``sglang:num_running_reqs``, ``sglang:num_queue_reqs``, ``sglang:token_usage`` (the
fraction of the KV pool in use, 0–1), ``sglang:cache_hit_rate`` (of its last prefill
batch only) and, in newer versions, ``sglang:max_total_num_tokens`` (the KV pool in
tokens), labelled ``model_name``, ``engine_type``, ``tp_rank``, ``pp_rank`` and, with
data parallelism, ``dp_rank``. Only the first rank of each tensor-parallel group
exports them unless ``--enable-metrics-for-all-schedulers``, when every rank repeats
its group's figures: so one sample per ``dp_rank`` is kept (its lowest ``tp_rank``,
``pp_rank``), counts and capacity add up over ``dp_rank``, fractions average.
The tokenizer's counters ``sglang:cached_tokens_total`` / ``sglang:prompt_tokens_total``
give the prefix-cache hit rate since start (the gauge is the fallback).

Capacity before that gauge existed: ``/get_server_info`` (``/server_info`` in the newest
versions, which keep the old path as an alias) holds the scheduler's
``max_total_num_tokens`` per data-parallel rank and ``dp_size``.
``/health`` (and ``/health_generate``, which always runs a one-token generation)
answers 503 while starting, shutting down or wedged, else 200. Errors are
``{"object": "error", "message", "type", "param", "code": <status>}``; a stream's error
event nests it under ``"error"``. A prompt past the context is a 400
("... is longer than the model's context length ..." or "Requested token count exceeds
the model's maximum context length ..."). A departed client of a non-streamed request
is noticed within 4 s (its wait for output polls the connection), so no stream is
needed for it. ``--enable-priority-scheduling`` orders by the request's ``priority``
with HIGHER values first by default (``--schedule-low-priority-values-first`` flips
it): the value sent is the negated sluicegate priority, right for the default flags.
"""

from __future__ import annotations

from collections.abc import Iterable

from sluicegate.engine_profiles.profile import EngineError, EngineProfile, Reading
from sluicegate.engine_profiles.prometheus_text import Samples

RUNNING = "sglang:num_running_reqs"
WAITING = "sglang:num_queue_reqs"
TOKEN_USAGE = "sglang:token_usage"
CAPACITY = "sglang:max_total_num_tokens"
CACHE_HIT_RATE = "sglang:cache_hit_rate"
CACHED_TOKENS = "sglang:cached_tokens_total"
PROMPT_TOKENS = "sglang:prompt_tokens_total"
CONTEXT_OVERFLOW = (
    "is longer than the model's context length",
    "exceeds the model's maximum context length",
)
"""How SGLang's 400s for a prompt past the context read (tokenizer_manager.py)."""


def _rank(labels: dict[str, str], key: str) -> int:
    try:
        return int(labels.get(key, "0"))
    except ValueError:
        return 0


def per_dp_rank(samples: Samples, name: str) -> list[float]:
    """One value of ``name`` per data-parallel rank: the sample of the lowest
    ``(tp_rank, pp_rank)`` among those of each ``dp_rank`` (absent: one rank)."""
    chosen: dict[str, tuple[tuple[int, int], float]] = {}
    for labels, value in samples.labelled(name):
        group = labels.get("dp_rank", "")
        order = (_rank(labels, "tp_rank"), _rank(labels, "pp_rank"))
        if group not in chosen or order < chosen[group][0]:
            chosen[group] = (order, value)
    return [value for _, value in chosen.values()]


def _sum(values: Iterable[float]) -> float | None:
    listed = list(values)
    return sum(listed) if listed else None


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


class SGLangProfile(EngineProfile):
    """SGLang's server, started with ``--enable-metrics``."""

    name = "sglang"
    summary = (
        "running, waiting, KV token usage, KV capacity (gauge or /get_server_info), "
        "prefix-cache hits; one sample per DP rank"
    )
    info_path = "/get_server_info"
    metric_names = frozenset(
        {RUNNING, WAITING, TOKEN_USAGE, CAPACITY, CACHE_HIT_RATE, CACHED_TOKENS, PROMPT_TOKENS}
    )
    priority_field = "priority"

    def read_metrics(self, samples: Samples) -> Reading:
        """Counts and capacity summed over DP ranks, fractions averaged (TP repeats dropped)."""
        running, waiting = _sum(per_dp_rank(samples, RUNNING)), _sum(per_dp_rank(samples, WAITING))
        capacity = _sum(per_dp_rank(samples, CAPACITY))
        return Reading(
            running=None if running is None else int(running),
            waiting=None if waiting is None else int(waiting),
            kv_usage=_mean(per_dp_rank(samples, TOKEN_USAGE)),
            kv_capacity_tokens=int(capacity) if capacity else None,
            prefix_hit_rate=self._hit_rate(samples),
        )

    @staticmethod
    def _hit_rate(samples: Samples) -> float | None:
        """Cached over prompt tokens since start; else the last prefill batch's gauge."""
        cached, prompt = samples.total(CACHED_TOKENS), samples.total(PROMPT_TOKENS)
        if cached is not None and prompt:
            return cached / prompt
        return _mean(per_dp_rank(samples, CACHE_HIT_RATE))

    def read_info(self, info: dict[str, object]) -> Reading:
        """``max_total_num_tokens`` (per DP rank) × ``dp_size`` (1 if absent)."""
        tokens, ranks = info.get("max_total_num_tokens"), info.get("dp_size", 1)
        if type(tokens) is not int or tokens <= 0:
            return Reading()
        if type(ranks) is not int or ranks <= 0:
            ranks = 1
        return Reading(kv_capacity_tokens=tokens * ranks)

    def error_code(self, status: int, error: EngineError) -> str | None:
        """A prompt past the context is ``context_length_exceeded``."""
        message = error.message or ""
        overflow = status == 400 and any(text in message for text in CONTEXT_OVERFLOW)
        return "context_length_exceeded" if overflow else None

    def priority_value(self, priority: int) -> int:
        """Negated: SGLang runs higher values first unless told otherwise."""
        return -priority
