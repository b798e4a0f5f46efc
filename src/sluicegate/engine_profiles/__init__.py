"""Engine profiles: what the gateway reads from, and how it talks to, each engine.

``PROFILES`` lists every profile by the ``engine:`` value that selects it; a backend's
``engine`` must name one. Each profile is one small module (``profile.py`` holds the
base) and passes the conformance suite in ``tests/engines/``.
"""

from __future__ import annotations

from sluicegate.engine_profiles.llama_server import LlamaCppPythonProfile, LlamaServerProfile
from sluicegate.engine_profiles.profile import EngineError, EngineProfile, Reading
from sluicegate.engine_profiles.prometheus_text import Samples, scan
from sluicegate.engine_profiles.ray_serve import RayServeProfile
from sluicegate.engine_profiles.sglang import SGLangProfile
from sluicegate.engine_profiles.tgi import TGIProfile
from sluicegate.engine_profiles.trtllm import TensorRTLLMProfile
from sluicegate.engine_profiles.vllm import EmulatorProfile, VLLMProfile

__all__ = [
    "PROFILES",
    "EngineError",
    "EngineProfile",
    "Reading",
    "Samples",
    "profile",
    "scan",
]

PROFILES: dict[str, EngineProfile] = {
    p.name: p
    for p in (
        VLLMProfile(),
        EmulatorProfile(),
        LlamaServerProfile(),
        LlamaCppPythonProfile(),
        TGIProfile(),
        TensorRTLLMProfile(),
        SGLangProfile(),
        RayServeProfile(),
    )
}


def profile(name: str) -> EngineProfile:
    """The profile of ``engine: name``; ``KeyError`` naming the choices if there is none."""
    try:
        return PROFILES[name]
    except KeyError:
        raise KeyError(f"unknown engine {name!r}; choose one of {sorted(PROFILES)}") from None
