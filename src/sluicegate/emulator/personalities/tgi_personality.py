"""The emulator as Text Generation Inference (``--personality tgi``).

From huggingface/text-generation-inference (3.3.6-dev0): metrics in TGI's names
(``tgi_metrics.py``); ``/health``; ``/info`` with the fields of router/src/lib.rs
``Info`` (``model_id``, ``max_concurrent_requests``, ``max_input_tokens``,
``max_total_tokens``, ``version``, ...) plus ``max_batch_total_tokens``, which TGI kept
there up to v2.2 (since v2.3.1 it is the ``tgi_batch_max_total_tokens`` gauge);
refusals as ``{"error": message, "error_type": kind}`` (router/src/lib.rs
``ErrorResponse``), a request's fault answered 422 (router/src/server.rs
``From<InferError>``); SSE keep-alive comments (``:``) after 15 s of silence, axum's
``KeepAlive::default()`` that every TGI stream uses. No priority scheduler.
"""

from __future__ import annotations

import re

from sluicegate.emulator.personalities.personality import EngineMetrics, JsonDocument, Personality
from sluicegate.emulator.personalities.tgi_metrics import TGIMetrics
from sluicegate.engine import Engine

VERSION = "2.2.0"
"""The TGI version ``/info`` reports: the last whose ``/info`` holds the KV capacity."""
_CAPACITY = re.compile(r"KV capacity of (\d+) tokens")


class TGIPersonality(Personality):
    """TGI's router (``text-generation-launcher``)."""

    gzip_metrics = False  # its exporter answers plain text only
    name = "tgi"
    keepalive_s = 15.0
    priority_field = None

    def metrics(self, model: str, engine: Engine) -> EngineMetrics:
        """TGI's gauges and counters (``tgi_`` names)."""
        return TGIMetrics(model, engine)

    def documents(self, model: str, engine: Engine) -> dict[str, JsonDocument]:
        """``/info``: the served model and the router's limits."""
        config = engine.config
        capacity = config.num_blocks * config.block_size

        def info() -> dict[str, object]:
            return {
                "model_id": model, "model_sha": None, "model_dtype": "torch.float16",
                "model_device_type": "cuda", "model_pipeline_tag": "text-generation",
                "max_concurrent_requests": 128, "max_best_of": 2, "max_stop_sequences": 4,
                "max_input_tokens": capacity - 1, "max_total_tokens": capacity,
                "waiting_served_ratio": 0.3, "max_batch_total_tokens": capacity,
                "max_waiting_tokens": 20, "max_batch_size": config.max_num_seqs,
                "validation_workers": 2, "max_client_batch_size": 4,
                "router": "text-generation-router", "version": VERSION, "sha": None,
                "docker_label": None,
            }  # fmt: skip

        return {"/info": info}

    def error_status(self, status: int, code: str) -> int:
        """A request's fault is 422 (TGI's ``validation``); other statuses as they are."""
        return 422 if status == 400 else status

    def error_body(
        self, status: int, message: str, code: str, param: str | None
    ) -> dict[str, object]:
        """``{"error", "error_type"}``; a prompt past the KV capacity in the words of
        router/src/validation.rs ``MaxTotalTokens``."""
        if status == 429:
            return {"error": "Model is overloaded", "error_type": "overloaded"}
        if status >= 500:
            return {"error": message, "error_type": "generation"}
        if code == "context_length_exceeded" and (found := _CAPACITY.search(message)):
            message = (
                f"`inputs` tokens + `max_new_tokens` must be <= {found.group(1)}. Given: {message}"
            )
        return {"error": f"Input validation error: {message}", "error_type": "validation"}
