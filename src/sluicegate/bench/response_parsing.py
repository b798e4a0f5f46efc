"""Parsing of OpenAI-style responses for the load generator: SSE streams and JSON bodies.

An SSE stream is framed into events by the gateway's own splitter
(``sluicegate.gateway.streams.sse.SseSplitter``: events end at a blank line, an event's
``data:`` lines are joined with newlines, an unfinished event is capped); ``data:
[DONE]`` ends an OpenAI stream. Lines arrive whole from ``aiohttp``'s line
iterator; each is timed here when it arrives.
"""

from __future__ import annotations

import math

import orjson

from sluicegate.bench.records import INVALID_RESPONSE, STREAM_ERROR
from sluicegate.gateway.streams.sse import SseSplitter

_DONE = b"[DONE]"


def parse_float(value: str | None) -> float | None:
    """``value`` as a finite float, or ``None`` when absent or not a number."""
    if value is None:
        return None
    try:
        number = float(value)
    except ValueError:
        return None
    return number if math.isfinite(number) else None


def error_code(body: bytes) -> str:
    """The OpenAI error ``code`` (else ``type``) of an error body, or ``""``.

    Accepts ``{"error": {...}}`` (OpenAI) and a bare ``{"code", "type", …}`` object
    (older vLLM).
    """
    try:
        payload = orjson.loads(body)
    except orjson.JSONDecodeError:
        return ""
    return _code_of(payload) or ""


def _code_of(payload: object) -> str | None:
    if not isinstance(payload, dict):
        return None
    inner = payload.get("error")
    error = inner if isinstance(inner, dict) else payload
    for key in ("code", "type"):
        value = error.get(key)
        if value is not None and value != "":
            return str(value)
    return None


class StreamStats:
    """Accumulates what a response says: content-chunk times, usage, finish reason, errors.

    Gaps between content chunks are summarised on the fly (mean = (last − first) /
    (chunks − 1), and the maximum), so no per-chunk list is kept.
    """

    __slots__ = ("_prev_s", "_splitter", "chunks", "done_s", "error", "finish_reason", "first_s",
                 "itl_max_s", "last_s", "streamed", "usage_tokens")  # fmt: skip

    def __init__(self) -> None:
        self._splitter = SseSplitter()
        self._prev_s: float | None = None
        self.chunks = 0
        self.first_s: float | None = None
        self.last_s: float | None = None
        self.itl_max_s: float | None = None
        self.done_s: float | None = None
        self.usage_tokens: int | None = None
        self.finish_reason = ""
        self.error = ""
        self.streamed = False

    @property
    def output_tokens(self) -> int:
        """Reported ``usage.completion_tokens``, else the content chunks counted."""
        return self.usage_tokens if self.usage_tokens is not None else self.chunks

    @property
    def itl_mean_s(self) -> float | None:
        """Mean gap between consecutive content chunks (``None`` below two chunks)."""
        if self.chunks < 2 or self.first_s is None or self.last_s is None:
            return None
        return (self.last_s - self.first_s) / (self.chunks - 1)

    def feed_line(self, raw: bytes, now: float) -> None:
        """One line of the stream (with or without its line ending), received at ``now``.

        An empty ``raw`` ends the line before it, so ``feed_line(b"", now)`` at the end of
        the body dispatches an event left without its blank line.
        """
        self.streamed = True
        splitter = self._splitter
        _, payloads = splitter.feed(raw if raw.endswith(b"\n") else raw + b"\n")
        for payload in payloads:
            self._dispatch(payload, now)
        if splitter.overflowed and not self.error:
            self.error = INVALID_RESPONSE

    def feed_json(self, body: bytes, now: float) -> bool:
        """A whole (non-streamed) JSON response; ``False`` if it is not a JSON object."""
        try:
            payload = orjson.loads(body)
        except orjson.JSONDecodeError:
            return False
        if not isinstance(payload, dict):
            return False
        self._absorb(payload, now, count_content=False)
        return True

    def _dispatch(self, data: bytes, now: float) -> None:
        if data == _DONE:
            self.done_s = now
            return
        try:
            payload = orjson.loads(data)
        except orjson.JSONDecodeError:
            return  # a keep-alive or a foreign event; an OpenAI stream never sends one
        if isinstance(payload, dict):
            self._absorb(payload, now, count_content=True)

    def _absorb(self, payload: dict[str, object], now: float, *, count_content: bool) -> None:
        if "error" in payload:
            self.error = _code_of(payload) or STREAM_ERROR
        usage = payload.get("usage")
        if isinstance(usage, dict) and isinstance(usage.get("completion_tokens"), int):
            self.usage_tokens = usage["completion_tokens"]
        choices = payload.get("choices")
        if not isinstance(choices, list):
            return
        content = False
        for choice in choices:
            if not isinstance(choice, dict):
                continue
            content = content or _has_content(choice)
            if choice.get("finish_reason"):
                self.finish_reason = str(choice["finish_reason"])
        if content and count_content:
            self._on_content(now)

    def _on_content(self, now: float) -> None:
        if self._prev_s is not None:
            gap = now - self._prev_s
            self.itl_max_s = gap if self.itl_max_s is None else max(self.itl_max_s, gap)
        if self.first_s is None:
            self.first_s = now
        self._prev_s = self.last_s = now
        self.chunks += 1


def _has_content(choice: dict[str, object]) -> bool:
    delta = choice.get("delta")
    if isinstance(delta, dict):
        return bool(delta.get("content") or delta.get("reasoning_content"))
    return bool(choice.get("text"))
