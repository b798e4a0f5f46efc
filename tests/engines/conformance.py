"""What every engine profile's fixtures hold, and how the conformance suite reads them.

Each profile has a folder ``fixtures/<engine>/`` (the emulator's profile shares vLLM's)
of recorded-format answers built from the engine's documented names and formats (the
source is named in ``expected.json``'s ``source``), and ``expected.json`` says what the
gateway must make of each:

- ``metrics``: ``{file: reading}`` — each Prometheus page (``metrics*.prom``) and the
  ``Reading`` fields the profile must read from it (a field left out must read None);
- ``info``: ``{file: reading}`` — the info documents (``info*.json``) of an engine with
  an ``info_path``;
- ``health``: ``[[status, healthy], ...]`` — what a health answer means;
- ``errors``: ``[{"status", "body", "relayed": [status, code, message] | null}]`` — the
  engine's error bodies and what the client gets (null: a 502 ``upstream_error``);
- ``streams``: ``{file: {"endpoint", "text", "done", "error", "usage"}}`` — SSE streams
  (``*.sse``): at least a normal one, one with a usage chunk, an error mid-stream and an
  abort, named ``normal``, ``usage``, ``error`` and ``abort`` (``.sse``).
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

FIXTURES = Path(__file__).with_name("fixtures")
SHARED = {"emulator": "vllm"}
"""Profiles that read exactly as another's, and so share its fixtures."""
STREAM_KINDS = ("normal", "usage", "error", "abort")


def folder(engine: str) -> Path:
    """The fixture folder of ``engine``'s profile."""
    return FIXTURES / SHARED.get(engine, engine)


@cache
def expected(engine: str) -> dict[str, Any]:
    """``expected.json`` of ``engine``'s fixtures."""
    loaded: dict[str, Any] = json.loads((folder(engine) / "expected.json").read_text())
    return loaded
