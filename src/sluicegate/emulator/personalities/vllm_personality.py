"""The emulator as vLLM (its default personality): vLLM V1's metric names
(``vllm_metrics.py``), ``/health``, and OpenAI's error shape, which vLLM answers since
0.10 (``{"error": {"message", "type", "param", "code"}}``, vllm/entrypoints/openai/protocol.py
``ErrorResponse``). Its priority field is ``priority`` (``--scheduling-policy priority``).
"""

from __future__ import annotations

from sluicegate.emulator.personalities.personality import EngineMetrics, Personality
from sluicegate.emulator.personalities.vllm_metrics import EmulatorMetrics
from sluicegate.engine import Engine


class VLLMPersonality(Personality):
    """vLLM's OpenAI server, ``vllm serve``."""

    name = "vllm"

    def metrics(self, model: str, engine: Engine) -> EngineMetrics:
        """vLLM V1's metrics (``vllm:`` names)."""
        return EmulatorMetrics(model, engine)
