"""Hugging Face Text Generation Inference (TGI), its router in front of the v3 backend.

Source (huggingface/text-generation-inference at 3.3.6-dev0, commit db931fc):
backends/v3/src/queue.rs sets ``tgi_queue_size`` (requests waiting for a batch) and
backends/v3/src/backend.rs ``tgi_batch_current_size`` (requests in the running batch)
and ``tgi_batch_current_max_tokens`` (the running batch's ``max_tokens``: the KV slots
it holds, ``num_blocks × BLOCK_SIZE`` in server/.../flash_causal_lm.py); both go to 0
when the batch drains. backends/v3/src/lib.rs sets ``tgi_batch_max_total_tokens`` once
after warm-up: the KV capacity in tokens (since v2.3.1, commit 0204946d; until v2.2
that figure was ``max_batch_total_tokens`` in ``/info``, router/src/lib.rs ``Info``,
dropped in v2.3.0). docs/source/reference/metrics.md lists the names.

KV usage is ``tgi_batch_current_max_tokens / tgi_batch_max_total_tokens``: the slots the
running batch has *reserved* (every request's prompt + ``max_new_tokens``, rounded up to
blocks; shared prefix blocks counted by each holder), not those written yet, and as of
the batch before the step's newcomers joined. It over-states use and lags a step,
which errs towards admitting less. A page without the capacity gauge (v2.2 and older)
gives no KV usage.

``/health`` is 200, or 503 ``{"error": "unhealthy", "error_type": "healthcheck"}``
(router/src/server.rs ``health``). Errors are ``{"error": <message>, "error_type": <kind>}``
(router/src/lib.rs ``ErrorResponse``) with the status of router/src/server.rs
``From<InferError>``: 422 ``validation`` (also ``template_error``, ``tool_error``,
``missing_template_variable``), 429 ``overloaded`` (more than
``--max-concurrent-requests`` in flight), 424 ``generation`` (the model failed), 500
``incomplete_generation``. TGI has no priority scheduler (the queue is first come,
first served).
"""

from __future__ import annotations

from sluicegate.engine_profiles.profile import EngineError, EngineProfile, Reading
from sluicegate.engine_profiles.prometheus_text import Samples

RUNNING = "tgi_batch_current_size"
WAITING = "tgi_queue_size"
BATCH_TOKENS = "tgi_batch_current_max_tokens"
CAPACITY = "tgi_batch_max_total_tokens"
CONTEXT_EXCEEDED = ("`inputs` tokens + `max_new_tokens` must be <=", "`inputs` must have less than")
"""How TGI's validation messages for a prompt past the context read (router/src/validation.rs
``MaxTotalTokens``, ``InputLength``), after ``Input validation error: ``."""
REQUEST_FAULTS = frozenset(
    {"validation", "template_error", "missing_template_variable", "tool_error"}
)
ENGINE_FAULTS = frozenset({"generation"})
"""Kinds TGI answers with a 4xx that are the engine's failure, not the request's."""


class TGIProfile(EngineProfile):
    """``text-generation-launcher`` (the router's ``/metrics``, ``/info``, ``/health``)."""

    name = "tgi"
    summary = (
        "running batch, queue, KV reserved by the batch over its capacity (metrics, "
        "or /info before v2.3)"
    )
    info_path = "/info"
    metric_names = frozenset({RUNNING, WAITING, BATCH_TOKENS, CAPACITY})

    def read_metrics(self, samples: Samples) -> Reading:
        """The batch and queue sizes; KV usage where the page has the capacity gauge."""
        running, waiting = samples.total(RUNNING), samples.total(WAITING)
        capacity = samples.total(CAPACITY)
        held = samples.total(BATCH_TOKENS)
        usage = None
        if capacity and held is not None:
            usage = min(held / capacity, 1.0)
        return Reading(
            running=None if running is None else int(running),
            waiting=None if waiting is None else int(waiting),
            kv_usage=usage,
            kv_capacity_tokens=int(capacity) if capacity else None,
        )

    def read_info(self, info: dict[str, object]) -> Reading:
        """``max_batch_total_tokens`` (TGI up to v2.2) as the KV capacity."""
        capacity = info.get("max_batch_total_tokens")
        if type(capacity) is int and capacity > 0:
            return Reading(kv_capacity_tokens=capacity)
        return Reading()

    def healthy(self, status: int) -> bool:
        """200 serves; 503 (its health check's prefill failed) and anything else do not."""
        return status == 200

    def read_error(self, answer: dict[str, object]) -> EngineError:
        """``{"error": message, "error_type": kind}``; OpenAI's shape as the base reads it
        (TGI's error events on its OpenAI routes: ``{"error": {"message", ...}}``)."""
        error = answer.get("error")
        if isinstance(error, str):
            kind = answer.get("error_type")
            return EngineError(error, kind if isinstance(kind, str) else None)
        return super().read_error(answer)

    def error_code(self, status: int, error: EngineError) -> str | None:
        """A prompt past the context is ``context_length_exceeded``, other request faults
        ``invalid_request``; 429 falls to ``rate_limit_exceeded`` by status."""
        if error.kind in REQUEST_FAULTS:
            text = (error.message or "").removeprefix("Input validation error: ")
            if text.startswith(CONTEXT_EXCEEDED):
                return "context_length_exceeded"
            return "invalid_request"
        return None

    def engine_fault(self, status: int, error: EngineError) -> bool:
        """A 424 ``generation`` error is the model failing: a 502, counted against the
        backend like its 5xx."""
        return status == 424 or error.kind in ENGINE_FAULTS
