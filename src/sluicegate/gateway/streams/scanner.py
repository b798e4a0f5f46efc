"""Accounting of an OpenAI event stream, one event payload at a time (``sse.SseSplitter``
frames them).

The stream relay forwards the engine's bytes as they arrive and scans the same
events on the side: the scanner counts generated chunks, picks up ``usage`` and
``finish_reason``, and notices ``[DONE]``, error events and payloads that are not
JSON objects. The common event, one content delta, is recognised without parsing it.
"""

from __future__ import annotations

import orjson

DONE = b"[DONE]"


def _is_plain_delta(payload: bytes) -> bool:
    """Whether ``payload`` is, by its bytes, one content delta with nothing else to read: no
    finish reason, usage or error, and non-empty content (a compact-JSON engine's common
    event). Such an event is counted as a chunk without being parsed."""
    return (
        b'"finish_reason":null' in payload
        and b'"usage"' not in payload
        and b'"error"' not in payload
        and b'"content":""' not in payload
        and b'"text":""' not in payload
        and b'"content":null' not in payload
    )


class SseScanner:
    """Counts chunks that carry output and picks up ``usage`` from an OpenAI SSE stream.

    A chunk that only opens the message (``"role"`` with empty content) or only
    closes it (``finish_reason`` with an empty delta) is not a token.
    """

    __slots__ = (
        "_beside",
        "_chunked",
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
        self._chunked = False  # a usage chunk came (its counts replace those beside choices)
        # Usage beside choices, per choice index: (prompt, completion) tokens so far.
        self._beside: dict[int, tuple[int | None, int | None]] | None = None

    def scan_all(self, payloads: list[bytes]) -> int:
        """Scan the payloads of some events; return how many content chunks they held."""
        before = self.chunks
        for payload in payloads:
            self.scan(payload)
        return self.chunks - before

    def scan(self, payload: bytes) -> None:
        """Scan one event's payload."""
        if payload == DONE:
            self.done = True
            return
        if _is_plain_delta(payload):
            self.chunks += 1
            return
        try:
            event = orjson.loads(payload)
        except orjson.JSONDecodeError:
            self.malformed = True
            return
        if not isinstance(event, dict):
            self.malformed = True
            return
        if "error" in event or event.get("object") == "error":
            # ``object: error``: vLLM before 0.10 (and SGLang, trtllm-serve) put the error's
            # fields at the top level of the event.
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
            index = None
            if isinstance(choices, list) and choices:
                first_index = choices[0].get("index") if isinstance(choices[0], dict) else None
                index = first_index if type(first_index) is int else 0
            self._usage(usage, index=index)

    def _usage(self, usage: dict[str, object], *, index: int | None) -> None:
        """Keep an event's usage (``index``: the choice it came beside; None for a usage
        chunk, which has no choices).

        Usage chunks add up: vLLM sends one for the whole answer, llama.cpp's server one
        per choice of an ``n`` > 1 chat request, each counting that choice's tokens and
        the same prompt. Usage beside a choice is that choice's so far (vLLM's continuous
        usage stats, llama.cpp's server on a completion's last chunk of each choice): the
        latest per choice, added over the choices, until a usage chunk comes.
        """
        prompt, completion = usage.get("prompt_tokens"), usage.get("completion_tokens")
        prompt = prompt if type(prompt) is int and prompt >= 0 else None
        completion = completion if type(completion) is int and completion >= 0 else None
        if index is None:
            if self._beside is not None:
                self._beside = None
                self.prompt_tokens = self.completion_tokens = None
            self._chunked = True
            if prompt is not None:
                self.prompt_tokens = max(prompt, self.prompt_tokens or 0)
            if completion is not None:
                self.completion_tokens = (self.completion_tokens or 0) + completion
            return
        if self._chunked:
            return
        if self._beside is None:
            self._beside = {}
        self._beside[index] = (prompt, completion)
        prompts = [p for p, _ in self._beside.values() if p is not None]
        completions = [c for _, c in self._beside.values() if c is not None]
        self.prompt_tokens = max(prompts) if prompts else None
        self.completion_tokens = sum(completions) if completions else None


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
