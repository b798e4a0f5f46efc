"""An engine's error event, mid-stream, in OpenAI's shape.

Engines end a failing stream with an error event of their own shape — vLLM's nested
``{"error": {...}}`` (``code`` an int), its flat ``{"object": "error", ...}`` before
0.10, SGLang's and trtllm-serve's likewise, TGI's ``{"error": ..., "error_type": ...}``
on its native routes, llama-server's ``{"error": {"code", "message", "type"}}``. The
relay forwards a stream's events as they come; the batch of events that holds the
error is written again with that event in OpenAI's shape (``{"error": {"message",
"type", "code", "param"}}`` with a string code), its other events as they were.
"""

from __future__ import annotations

import orjson

from sluicegate.engine_profiles import EngineProfile
from sluicegate.gateway.streams.scanner import DONE


def _is_error(event: object) -> bool:
    return isinstance(event, dict) and ("error" in event or event.get("object") == "error")


def openai_error_events(profile: EngineProfile, payloads: list[bytes]) -> bytes:
    """The events of ``payloads`` as ``data:`` events, each engine error event rewritten in
    OpenAI's shape with the message ``profile`` reads from it."""
    out = []
    for payload in payloads:
        if payload != DONE:
            try:
                event = orjson.loads(payload)
            except orjson.JSONDecodeError:
                event = None
            if _is_error(event):
                assert isinstance(event, dict)
                error = profile.read_error(event)
                code = profile.error_code(500, error) or "upstream_error"
                message = error.message or "the engine reported an error"
                body = {"message": message, "type": "api_error", "code": code, "param": None}
                payload = orjson.dumps({"error": body})
        out.append(b"data: " + payload + b"\n\n")
    return b"".join(out)
