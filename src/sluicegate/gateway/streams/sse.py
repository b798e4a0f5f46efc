"""The one server-sent-events splitter: bytes, cut into reads anyhow, into whole events.

Used wherever sluicegate reads an event stream: the gateway's stream relay
(which forwards whole events only, so an error event of its own never lands
mid-event), the reassembly of non-streamed answers, and the load generator.

An event ends at a blank line; its payload is its ``data:`` lines joined with
newlines (the SSE rule), each line's value stripped of surrounding whitespace
(insignificant in JSON, which is all an OpenAI stream carries, and in
``[DONE]``). Events with no data (comments such as keep-alives) yield nothing.
Lines end with LF or CRLF. An unfinished event may hold at most
``MAX_EVENT_BYTES``; past that it is dropped and ``overflowed`` is set, so an
engine that never ends a line cannot grow the gateway's memory.

The common stream, one ``data:`` line per event, is split with a few calls on
the whole read (``bytes.split``, ``count``) and one list comprehension, not a
Python loop over lines.
"""

from __future__ import annotations

MAX_EVENT_BYTES = 1 << 20
EVENT_TOO_LARGE = f"the engine sent an event over {MAX_EVENT_BYTES} bytes"
"""The message of the ``upstream_event_too_large`` error (an event over the cap)."""
_DATA = b"data:"


def _end_of_last_event(buffer: bytes, start: int) -> int:
    """Where the last blank line in ``buffer`` ends (0 if none), looking from ``start``
    on; ``buffer`` begins at the start of a line."""
    lf, crlf = buffer.rfind(b"\n\n", start), buffer.rfind(b"\n\r\n", start)
    end = max(lf + 2 if lf >= 0 else 0, crlf + 3 if crlf >= 0 else 0)
    if end == 0 and start == 0 and buffer[:1] == b"\n":
        return 1
    if end == 0 and start == 0 and buffer[:2] == b"\r\n":
        return 2
    return end


def _payloads_by_line(text: bytes) -> list[bytes]:
    """The payloads of the events in ``text`` (LF line endings), read line by line."""
    payloads: list[bytes] = []
    data: list[bytes] = []
    for line in text.split(b"\n"):
        if line.startswith(_DATA):
            data.append(line[5:].strip())
        elif not line and data:
            payloads.append(data[0] if len(data) == 1 else b"\n".join(data))
            data = []
        # other fields (event:, id:, retry:) and comments (":...") carry nothing we use
    if data:
        payloads.append(data[0] if len(data) == 1 else b"\n".join(data))
    return payloads


def payloads_of(events: bytes) -> list[bytes]:
    """The payloads of whole events (``events`` ends with a blank line, or holds only whole
    lines of one unfinished event)."""
    text = events.replace(b"\r\n", b"\n") if b"\r" in events else events
    parts = text.split(b"\n\n")
    if text.count(b"\n") == 2 * (len(parts) - 1):
        # Every event is one line: no line-by-line reading needed.
        return [part[5:].strip() for part in parts if part.startswith(_DATA)]
    return _payloads_by_line(text)


class SseSplitter:
    """Splits an SSE byte stream into events, however its bytes were cut into reads.

    ``feed`` returns, per read, the bytes of the events it completed (exactly
    as received, with any held from earlier reads, ending with their blank
    lines) and each completed event's payload. What follows the last blank line
    is held until its event completes, or until ``close``.
    """

    __slots__ = ("_pending", "overflowed")

    def __init__(self) -> None:
        self._pending = b""  # bytes after the last event boundary
        self.overflowed = False

    def feed(self, chunk: bytes) -> tuple[bytes, list[bytes]]:
        """Take one read: (the whole events it completed, as bytes; their payloads)."""
        whole = self.events(chunk)
        return whole, payloads_of(whole) if whole else []

    def events(self, chunk: bytes) -> bytes:
        """Take one read: the whole events it completed, as bytes (``feed`` without reading
        them into payloads, for a caller that reads them its own way)."""
        pending = self._pending
        if pending:
            buffer = pending + chunk
            # The held bytes have no blank line; one may end just after them.
            end = _end_of_last_event(buffer, max(0, len(pending) - 2))
        else:
            buffer = chunk
            end = _end_of_last_event(buffer, 0)
        if end == len(buffer):
            self._pending = b""
            return buffer
        held = buffer[end:]
        if len(held) > MAX_EVENT_BYTES:
            self.overflowed = True
            held = b""
        self._pending = held
        return buffer[:end]

    def close(self) -> tuple[bytes, list[bytes]]:
        """The stream ended: (the bytes still held; the payload of an event left without its
        blank line, from its whole lines, if it has data). A last line without its line
        ending is not read."""
        held, self._pending = self._pending, b""
        lines = held[: held.rfind(b"\n") + 1]
        return held, payloads_of(lines) if lines else []
