"""The emulator as llama.cpp's ``llama-server`` (``--personality llama-server``).

From llama-server 0.3.36 as recorded (tests/engines/fixtures/llama-server): ``llamacpp:``
metrics (``llama_server_metrics.py``), ``/health`` answering ``{"status": "ok"}``, and
its error body ``{"error": {"code", "message", "type"}}`` (tools/server's
``format_error_response``), where a prompt past the context is an
``exceed_context_size_error``. It has no priority scheduler and sends no keep-alive
comments.
"""

from __future__ import annotations

from sluicegate.emulator.personalities.llama_server_metrics import LlamaServerMetrics
from sluicegate.emulator.personalities.personality import EngineMetrics, Personality
from sluicegate.engine import Engine


class LlamaServerPersonality(Personality):
    """``llama-server --metrics``."""

    gzip_metrics = False  # its exporter answers plain text only
    name = "llama-server"
    priority_field = None

    def metrics(self, model: str, engine: Engine) -> EngineMetrics:
        """llama-server's ``llamacpp:`` metrics (unlabelled: one model per process)."""
        return LlamaServerMetrics(engine)

    def health_body(self) -> dict[str, object] | None:
        """``{"status": "ok"}``, as llama-server answers once its model is loaded."""
        return {"status": "ok"}

    def error_body(
        self, status: int, message: str, code: str, param: str | None
    ) -> dict[str, object]:
        """llama-server's shape: the status as ``code``, its own error type."""
        if code == "context_length_exceeded":
            kind = "exceed_context_size_error"
        else:
            kind = "invalid_request_error" if status < 500 else "server_error"
        return {"error": {"code": status, "message": message, "type": kind}}
