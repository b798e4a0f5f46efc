"""One line of a batch's input file: read, checked, and turned into a request or an error.

A line is ``{"custom_id": ..., "method": "POST", "url": <the batch's endpoint>,
"body": {...}}`` as in OpenAI's Batch API. A line that is not one becomes an
error line of the batch's error file (``LineError``); the others run.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import orjson

ENDPOINTS = ("/v1/chat/completions", "/v1/completions", "/v1/embeddings")
"""The endpoints a batch may target."""

MAX_CUSTOM_ID = 512


@dataclass(frozen=True, slots=True)
class LineRequest:
    """A line that runs: its ``custom_id``, the model it names and the request body (JSON)."""

    custom_id: str
    model: str
    body: bytes


@dataclass(frozen=True, slots=True)
class LineError:
    """A line that does not run: its ``custom_id`` if it had one, and why (OpenAI's shape)."""

    custom_id: str | None
    code: str
    message: str


LaneCheck = Callable[[str], str | None]
"""Given a model name, why a line for it cannot run (unknown model, no such lane), or None."""


def read_line(
    text: bytes, endpoint: str, check_model: LaneCheck, max_bytes: int
) -> LineRequest | LineError:
    """Check one input line (without its newline) of a batch for ``endpoint``."""
    if len(text) > max_bytes:
        return LineError(None, "line_too_large", f"the line is over {max_bytes} bytes")
    try:
        data = orjson.loads(text)
    except orjson.JSONDecodeError:
        return LineError(None, "invalid_json_line", "the line is not valid JSON")
    if not isinstance(data, dict):
        return LineError(None, "invalid_json_line", "the line is not a JSON object")
    custom_id = data.get("custom_id")
    if not isinstance(custom_id, str) or not custom_id or len(custom_id) > MAX_CUSTOM_ID:
        return LineError(
            None,
            "invalid_custom_id",
            f"custom_id must be a non-empty string of at most {MAX_CUSTOM_ID} characters",
        )
    if data.get("method") != "POST":
        return LineError(custom_id, "invalid_method", "method must be POST")
    if data.get("url") != endpoint:
        return LineError(custom_id, "invalid_url", f"url must be the batch's endpoint, {endpoint}")
    body = data.get("body")
    if not isinstance(body, dict):
        return LineError(custom_id, "invalid_body", "body must be a JSON object")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        return LineError(custom_id, "invalid_body", "body.model must be a string")
    if body.get("stream"):
        return LineError(custom_id, "invalid_body", "a batch line cannot stream (body.stream)")
    problem = check_model(model)
    if problem is not None:
        return LineError(custom_id, "model_not_found", problem)
    return LineRequest(custom_id, model, orjson.dumps(body))
