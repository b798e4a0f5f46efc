"""The emulator as TensorRT-LLM's ``trtllm-serve``: its ``trtllm_*`` metrics on
``/prometheus/metrics`` (``trtllm_metrics.py``; the real server mounts that page with
``return_perf_metrics: true``), ``/health``, and its error body, vLLM's older shape with the
status as ``code`` (tensorrt_llm/serve/openai_protocol.py ``ErrorResponse``; ``type`` as
``OpenAIServer.create_error_response`` names it). No priority field: ``trtllm-serve``
takes one on ``/v1/completions`` only in recent releases (see ``engine_profiles/trtllm.py``).
"""

from __future__ import annotations

from sluicegate.emulator.personalities.personality import EngineMetrics, Personality
from sluicegate.emulator.personalities.trtllm_metrics import TensorRTLLMMetrics
from sluicegate.engine import Engine

ERROR_TYPES = {400: "BadRequestError", 404: "InvalidRequestError", 501: "NotImplementedError"}
"""``type`` by status, as ``OpenAIServer`` sets it; any other is ``InternalServerError``."""


class TensorRTLLMPersonality(Personality):
    """TensorRT-LLM's OpenAI server, ``trtllm-serve``."""

    name = "trtllm"
    metrics_path = "/prometheus/metrics"
    priority_field = None

    def metrics(self, model: str, engine: Engine) -> EngineMetrics:
        """``trtllm-serve``'s metrics (``trtllm_`` names)."""
        return TensorRTLLMMetrics(model, engine)

    def error_body(
        self, status: int, message: str, code: str, param: str | None
    ) -> dict[str, object]:
        """``{"object": "error", "message", "type", "param", "code": <status>}``."""
        kind = ERROR_TYPES.get(status, "InternalServerError")
        if code == "context_length_exceeded":  # worded as the LLM API's argument check
            message = f"The prompt length and max_tokens should not exceed max_seq_len: {message}"
        return {"object": "error", "message": message, "type": kind, "param": param, "code": status}
