"""An incremental scanner of an OpenAI server-sent event stream, for accounting only.

Bytes are forwarded to the client as they arrive; the scanner looks at the
same bytes on the side to count generated chunks, find ``usage`` and
``finish_reason``, and notice error events, without ever holding more than
one partial line.
"""

from __future__ import annotations

import orjson

MAX_LINE_BYTES = 1 << 20


class SseScanner:
    """Counts chunks that carry output and picks up ``usage`` from an OpenAI SSE stream.

    A chunk that only opens the message (``"role"`` with empty content) or only
    closes it (``finish_reason`` with an empty delta) is not a token.
    """

    __slots__ = (
        "_partial",
        "chunks",
        "completion_tokens",
        "done",
        "error",
        "finish_reason",
        "malformed",
        "prompt_tokens",
    )

    def __init__(self) -> None:
        self.chunks = 0
        self.done = False
        self.error = False
        self.malformed = False
        self.finish_reason: str | None = None
        self.prompt_tokens: int | None = None
        self.completion_tokens: int | None = None
        self._partial = b""

    def feed(self, data: bytes) -> int:
        """Scan ``data``; return how many content chunks it completed."""
        before = self.chunks
        buffer = self._partial + data if self._partial else data
        lines = buffer.split(b"\n")
        self._partial = lines.pop()
        if len(self._partial) > MAX_LINE_BYTES:
            self.malformed = True
            self._partial = b""
        for line in lines:
            if line.startswith(b"data:"):
                self._event(line[5:].strip())
        return self.chunks - before

    def _event(self, payload: bytes) -> None:
        if payload == b"[DONE]":
            self.done = True
            return
        if (
            b'"finish_reason":null' in payload
            and b'"usage"' not in payload
            and b'"error"' not in payload
            and b'"content":""' not in payload
            and b'"text":""' not in payload
            and b'"content":null' not in payload
        ):
            self.chunks += 1  # the common case: one content delta, no need to parse it
            return
        try:
            event = orjson.loads(payload)
        except orjson.JSONDecodeError:
            self.malformed = True
            return
        if not isinstance(event, dict):
            self.malformed = True
            return
        if "error" in event:
            self.error = True
            return
        choices = event.get("choices")
        if isinstance(choices, list) and choices and isinstance(choices[0], dict):
            first = choices[0]
            if _carries_output(first):
                self.chunks += 1
            if isinstance(first.get("finish_reason"), str):
                self.finish_reason = first["finish_reason"]
        usage = event.get("usage")
        if isinstance(usage, dict):
            prompt, completion = usage.get("prompt_tokens"), usage.get("completion_tokens")
            if type(prompt) is int and prompt >= 0:
                self.prompt_tokens = prompt
            if type(completion) is int and completion >= 0:
                self.completion_tokens = completion


def _carries_output(choice: dict[str, object]) -> bool:
    """Whether a streamed choice holds generated output (not just a role or a finish)."""
    text = choice.get("text")
    if isinstance(text, str) and text:
        return True
    delta = choice.get("delta")
    if not isinstance(delta, dict):
        return False
    content = delta.get("content")
    return bool(isinstance(content, str) and content) or bool(delta.get("tool_calls"))
