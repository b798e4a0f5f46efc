"""Hardening tests reuse the gateway tests' harness (real uvicorn servers on loopback)."""

from __future__ import annotations

import sys
from pathlib import Path

_GATEWAY_TESTS = str(Path(__file__).resolve().parent.parent / "gateway")
if _GATEWAY_TESTS not in sys.path:
    sys.path.insert(0, _GATEWAY_TESTS)
