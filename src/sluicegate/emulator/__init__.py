"""The engine model served in real time behind an OpenAI-compatible API (DESIGN §11).

``build_app`` gives the ASGI app; ``serve`` runs it under uvicorn
(``sluicegate emulate``). Streaming has the engine's real inter-token gaps, a
client that disconnects aborts its request, and ``/metrics`` carries vLLM's
metric names, so the gateway treats the emulator exactly as a vLLM backend.
Started with ``--scheduling-policy priority`` it schedules by each request's
``priority`` field as vLLM V1 does (waiting order, KV victims); under the default
``fcfs`` a non-zero ``priority`` is refused with a 400, as vLLM refuses it.
"""

from __future__ import annotations

from sluicegate.emulator.personalities.vllm_metrics import EmulatorMetrics
from sluicegate.emulator.runner import EngineRunner, FinishReason, RequestStream, RunnerStats
from sluicegate.emulator.server import build_app, serve
from sluicegate.emulator.text import FakeText

__all__ = [
    "EmulatorMetrics",
    "EngineRunner",
    "FakeText",
    "FinishReason",
    "RequestStream",
    "RunnerStats",
    "build_app",
    "serve",
]
