"""Rebuild a non-streaming OpenAI answer from a stream, so a preempted request keeps its text.

A non-streaming request that may be preempted with ``abort`` is sent to the
engine as a stream; the gateway gathers the chunks and answers with a normal
completion body. When the request is preempted, the body holds what was
generated so far, with ``finish_reason: "preempted"``.
"""

from __future__ import annotations

import time

import orjson

from sluicegate.gateway.classify import Endpoint

# Fields whose streamed form this assembler does not merge: such requests are
# forwarded untouched instead.
UNMERGED_FIELDS = ("tools", "functions", "logprobs", "top_logprobs", "tool_choice")


def streamable_copy(raw: bytes) -> bytes | None:
    """``raw`` rewritten to stream with usage, or ``None`` if its answer can't be rebuilt."""
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(body, dict) or body.get("n", 1) != 1:
        return None
    if any(field in body for field in UNMERGED_FIELDS):
        return None
    body["stream"] = True
    body["stream_options"] = {"include_usage": True}
    try:
        return orjson.dumps(body)
    except TypeError:  # nested deeper than orjson writes
        return None


def _counts(usage: dict[str, object]) -> dict[str, object]:
    """The token counts of an engine's ``usage``, each a non-negative integer, nothing else."""
    return {
        name: value
        for name in ("prompt_tokens", "completion_tokens", "total_tokens")
        if type(value := usage.get(name)) is int and value >= 0
    }


class StreamAssembler:
    """Collects the content, finish reason and usage of an OpenAI event stream."""

    def __init__(self, endpoint: Endpoint) -> None:
        self.endpoint = endpoint
        self.parts: list[str] = []
        self.finish_reason: str | None = None
        self.usage: dict[str, object] | None = None
        self.id = ""
        self.model = ""
        self.created = int(time.time())
        self.done = False
        self._partial = b""

    def feed(self, data: bytes) -> None:
        """Scan one read of the stream."""
        lines = (self._partial + data).split(b"\n")
        self._partial = lines.pop()
        for line in lines:
            if line.startswith(b"data:"):
                self._event(line[5:].strip())

    def _event(self, payload: bytes) -> None:
        if payload == b"[DONE]":
            self.done = True
            return
        try:
            event = orjson.loads(payload)
        except orjson.JSONDecodeError:
            return
        if not isinstance(event, dict):
            return
        event_id, model = event.get("id"), event.get("model")
        if isinstance(event_id, str) and event_id:
            self.id = event_id
        if isinstance(model, str) and model:
            self.model = model
        usage = event.get("usage")
        if isinstance(usage, dict):
            self.usage = _counts(usage) or None
        choices = event.get("choices")
        if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
            return
        choice = choices[0]
        delta = choice.get("delta")
        text = delta.get("content") if isinstance(delta, dict) else choice.get("text")
        if isinstance(text, str):
            self.parts.append(text)
        if isinstance(choice.get("finish_reason"), str):
            self.finish_reason = choice["finish_reason"]

    def body(self, *, prompt_tokens: int, finish_reason: str | None = None) -> bytes:
        """The non-streaming answer (``finish_reason`` overrides the stream's own)."""
        text = "".join(self.parts)
        reason = finish_reason or self.finish_reason or "stop"
        choice: dict[str, object]
        if self.endpoint == "chat":
            message = {"role": "assistant", "content": text}
            choice = {"index": 0, "message": message, "finish_reason": reason}
            kind = "chat.completion"
        else:
            choice = {"index": 0, "text": text, "finish_reason": reason}
            kind = "text_completion"
        usage = self.usage
        if usage is None or finish_reason is not None:
            completion = len([p for p in self.parts if p])
            usage = {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": completion,
                "total_tokens": prompt_tokens + completion,
            }
        body = {
            "id": self.id,
            "object": kind,
            "created": self.created,
            "model": self.model,
            "choices": [choice],
            "usage": usage,
        }
        return orjson.dumps(body)
