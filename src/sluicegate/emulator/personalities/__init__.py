"""The engines the emulator can play (``sluicegate emulate --personality``): one module
each, ``PERSONALITIES`` lists them by name (the engine's profile name)."""

from __future__ import annotations

from sluicegate.emulator.personalities.llama_server_personality import LlamaServerPersonality
from sluicegate.emulator.personalities.personality import EngineMetrics, JsonDocument, Personality
from sluicegate.emulator.personalities.sglang_personality import SGLangPersonality
from sluicegate.emulator.personalities.tgi_personality import TGIPersonality
from sluicegate.emulator.personalities.trtllm_personality import TensorRTLLMPersonality
from sluicegate.emulator.personalities.vllm_personality import VLLMPersonality

__all__ = ["PERSONALITIES", "EngineMetrics", "JsonDocument", "Personality", "personality"]

PERSONALITIES: dict[str, Personality] = {
    p.name: p
    for p in (
        VLLMPersonality(),
        LlamaServerPersonality(),
        TGIPersonality(),
        TensorRTLLMPersonality(),
        SGLangPersonality(),
    )
}


def personality(name: str) -> Personality:
    """The personality called ``name``; ``KeyError`` naming the choices if none is."""
    try:
        return PERSONALITIES[name]
    except KeyError:
        raise KeyError(
            f"unknown personality {name!r}; choose one of {sorted(PERSONALITIES)}"
        ) from None
