"""Sans-I/O model of a continuous-batching LLM engine (DESIGN §11): step timing, KV-cache
capacity, chunked prefill, recompute preemption, and calibrated presets.

Drivers (the simulator's virtual clock, the emulator's real-time loop) call
``Engine.step(now)`` and apply each ``StepResult`` at ``now + duration_s``.
"""

from __future__ import annotations

from sluicegate.engine.engine_config import EngineConfig
from sluicegate.engine.lengths import (
    DEFAULT_LENGTH_MODEL,
    OutputLengthModel,
    draw_output_tokens,
    request_normal,
    resolve_output_tokens,
)
from sluicegate.engine.model import Engine, StepResult
from sluicegate.engine.presets import PRESETS, preset

__all__ = [
    "DEFAULT_LENGTH_MODEL",
    "PRESETS",
    "Engine",
    "EngineConfig",
    "OutputLengthModel",
    "StepResult",
    "draw_output_tokens",
    "preset",
    "request_normal",
    "resolve_output_tokens",
]
