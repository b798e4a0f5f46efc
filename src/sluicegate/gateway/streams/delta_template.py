"""Recognising a stream's plain content deltas without parsing them.

The events of one OpenAI stream are alike: a content delta differs from the next
only in its text. A ``DeltaTemplate`` is made from a plain delta that was parsed:
its payload's bytes before and after the text's JSON string token. Any
later payload that is exactly that prefix, one JSON string token, and that suffix
is the same event with other text, so reading it needs no parse: its token is kept
as it came, and all kept tokens are decoded together (``decoded_tokens``). A long
run of such events is even split out of the raw stream in a few bulk calls
(``DeltaTemplate.run``).

Nothing here guesses: a payload that differs anywhere else, or whose middle is not
exactly one string token, is not the template's, and its reader parses it.
"""

from __future__ import annotations

import re
from typing import Any

import orjson

# Lines of one JSON string token each (escapes are checked when the tokens are decoded).
_TOKEN_LINES = re.compile(rb'"(?:[^"\\\n]|\\[^\n])*"(?:\n"(?:[^"\\\n]|\\[^\n])*")*')
_BACKSLASH = ord("\\")


def _string_end(payload: bytes, start: int) -> int:
    """The index of the quote closing the JSON string that opens at ``start`` (-1 if none)."""
    at = start
    while (at := payload.find(b'"', at + 1)) >= 0:
        backslashes = 0
        while payload[at - 1 - backslashes] == _BACKSLASH:
            backslashes += 1
        if backslashes % 2 == 0:
            return at
    return -1


def decoded_tokens(tokens: list[bytes]) -> list[str] | None:
    """JSON string tokens decoded in one call; ``None`` if any is not a valid string."""
    try:
        strings = orjson.loads(b"[" + b",".join(tokens) + b"]")
    except orjson.JSONDecodeError:
        return None
    if isinstance(strings, list) and len(strings) == len(tokens):
        return strings
    return None


class DeltaTemplate:
    """A plain content delta's payload split around its text (a JSON string token).

    Another payload made of the same prefix and suffix with one JSON string token
    between them is, byte for byte, the same event with other text: it needs no parse.
    """

    __slots__ = ("_prefix", "_separator", "_suffix", "_trim", "id", "index", "key", "model")

    def __init__(
        self, prefix: bytes, suffix: bytes, event: dict[str, Any], key: str, index: int
    ) -> None:
        self.key = key  # the text field: content, reasoning_content, reasoning or text
        self.index = index  # the choice it is a delta of
        self._prefix = prefix
        self._suffix = suffix
        self._trim = len(prefix) + len(suffix) + 2
        # Between two such events on the wire: one's end, a blank line, the next one's start.
        self._separator = suffix + b"\n\ndata: " + prefix
        event_id, model = event.get("id"), event.get("model")
        self.id = event_id if isinstance(event_id, str) and event_id else None
        self.model = model if isinstance(model, str) and model else None

    @classmethod
    def of(
        cls, payload: bytes, event: dict[str, Any], key: str, index: int = 0
    ) -> DeltaTemplate | None:
        """The template of a parsed ``event`` (a delta of choice ``index``) whose text
        field (``key``) is its only one by that name; ``None`` if its text cannot be
        located in ``payload`` exactly."""
        name = key.encode()
        marker = b'"' + name + b'":'
        at = payload.find(marker)
        if at < 0 or payload.count(b'"' + name + b'"') != 1:
            return None
        start = at + len(marker)
        if payload[start : start + 1] == b" ":
            start += 1
        end = _string_end(payload, start) + 1
        if payload[start : start + 1] != b'"' or end <= 0:
            return None
        return cls(payload[:start], payload[end:], event, key, index)

    def token(self, payload: bytes) -> bytes | None:
        """The text's JSON string token if ``payload`` is this template around one."""
        prefix, suffix = self._prefix, self._suffix
        if len(payload) < self._trim or not (
            payload.startswith(prefix) and payload.endswith(suffix)
        ):
            return None
        token = payload[len(prefix) : len(payload) - len(suffix)]
        return token if _TOKEN_LINES.fullmatch(token) is not None else None

    def run(self, events: bytes) -> tuple[bytes, list[bytes], bytes] | None:
        """Split whole events (LF line endings) around a run of this template's events:
        (the events before the run and its first; the string tokens of the ones between;
        its last and the events after). ``None`` if there is no such run, or anything
        between two separators is not exactly one string token on one line.

        The work is a few calls on the whole bytes, whatever the number of events.
        """
        parts = events.split(self._separator)
        if len(parts) < 3:
            return None
        between = parts[1:-1]
        if _TOKEN_LINES.fullmatch(b"\n".join(between)) is None:
            return None
        return parts[0] + self._suffix + b"\n\n", between, b"data: " + self._prefix + parts[-1]
