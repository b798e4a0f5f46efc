"""The emulator as SGLang (``--personality sglang``): ``sglang:`` metrics
(``sglang_metrics.py``), ``/health``, the server-info document at both its paths
(``/get_server_info``, and ``/server_info`` of the newest versions) with the scheduler's
``max_total_num_tokens``, and SGLang's flat error body
(python/sglang/srt/entrypoints/openai/serving_base.py ``create_error_response``:
``{"object": "error", "message", "type", "param", "code": <status>}``). Its priority
field is ``priority`` (``--enable-priority-scheduling``).
"""

from __future__ import annotations

from sluicegate.emulator.personalities.personality import EngineMetrics, JsonDocument, Personality
from sluicegate.emulator.personalities.sglang_metrics import SGLangMetrics
from sluicegate.engine import Engine

ERROR_TYPES = {400: "BadRequestError", 404: "NotFoundError", 501: "NotImplementedError"}


class SGLangPersonality(Personality):
    """SGLang's server, ``python -m sglang.launch_server --enable-metrics``."""

    name = "sglang"

    def metrics(self, model: str, engine: Engine) -> EngineMetrics:
        """SGLang's scheduler and tokenizer metrics (``sglang:`` names)."""
        return SGLangMetrics(model, engine)

    def documents(self, model: str, engine: Engine) -> dict[str, JsonDocument]:
        """The server-info document (server args, scheduler info, internal states)."""
        config = engine.config

        def server_info() -> dict[str, object]:
            info: dict[str, object] = {
                "model_path": model,
                "served_model_name": model,
                "tp_size": 1,
                "dp_size": 1,
                "enable_metrics": True,
                "max_running_requests": config.max_num_seqs,
                "internal_states": [{"last_gen_throughput": 0.0}],
                "version": "emulated",
            }
            if not config.batch_independent:
                info["max_total_num_tokens"] = config.num_blocks * config.block_size
            return info

        return {"/get_server_info": server_info, "/server_info": server_info}

    def error_body(
        self, status: int, message: str, code: str, param: str | None
    ) -> dict[str, object]:
        """SGLang's flat error object; its ``code`` is the HTTP status."""
        kind = ERROR_TYPES.get(status, "BadRequestError" if status < 500 else "InternalServerError")
        if code == "context_length_exceeded":  # worded as its tokenizer manager words it
            message = f"Requested token count exceeds the model's maximum context length: {message}"
        return {"object": "error", "message": message, "type": kind, "param": param, "code": status}
