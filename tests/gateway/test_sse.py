"""``sse.SseScanner``: accounting on the side of an OpenAI event stream, whatever its framing."""

from __future__ import annotations

import itertools

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from sluicegate.gateway.sse import MAX_LINE_BYTES, SseScanner


def _event(payload: object) -> bytes:
    return b"data: " + orjson.dumps(payload) + b"\n\n"


def _token(text: str, finish: str | None = None) -> dict[str, object]:
    choice = {"index": 0, "delta": {"content": text}, "finish_reason": finish}
    return {"id": "chatcmpl-1", "object": "chat.completion.chunk", "choices": [choice]}


def _stream(texts: list[str], usage: tuple[int, int] | None, *, crlf: bool = False) -> bytes:
    """A vLLM-style chat stream: one chunk per token, the last carrying finish_reason, then
    an optional usage chunk and ``[DONE]``; a comment line first, as keep-alives are."""
    events = [b": keep-alive\n\n"]
    events += [
        _event(_token(text, "length" if i == len(texts) - 1 else None))
        for i, text in enumerate(texts)
    ]
    if usage is not None:
        prompt, completion = usage
        body = {"prompt_tokens": prompt, "completion_tokens": completion}
        events.append(_event({"id": "chatcmpl-1", "choices": [], "usage": body}))
    events.append(b"data: [DONE]\n\n")
    data = b"".join(events)
    return data.replace(b"\n", b"\r\n") if crlf else data


def _scan(pieces: list[bytes]) -> tuple[SseScanner, int]:
    scanner = SseScanner()
    returned = sum(scanner.feed(piece) for piece in pieces)
    return scanner, returned


def _facts(scanner: SseScanner) -> tuple[object, ...]:
    return (
        scanner.chunks, scanner.done, scanner.error, scanner.malformed,
        scanner.finish_reason, scanner.prompt_tokens, scanner.completion_tokens,
    )  # fmt: skip


def _split(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({min(cut, len(data)) for cut in cuts})
    bounds = [0, *points, len(data)]
    return [data[a:b] for a, b in itertools.pairwise(bounds)]


def test_whole_stream_yields_chunks_usage_finish_and_done() -> None:
    """Fed at once, a stream yields one chunk per token, the usage, the finish reason and
    ``done``."""
    scanner, returned = _scan([_stream(["a", "b", "c"], (11, 3))])
    assert _facts(scanner) == (3, True, False, False, "length", 11, 3)
    assert returned == 3


def test_stream_without_usage_leaves_usage_unknown() -> None:
    """Without a usage chunk the token counts stay None (the caller falls back to chunks)."""
    scanner, _ = _scan([_stream(["a", "b"], None)])
    assert (scanner.chunks, scanner.prompt_tokens, scanner.completion_tokens) == (2, None, None)


def test_stream_cut_before_done_is_not_done() -> None:
    """A stream that ends without ``data: [DONE]`` is not ``done``."""
    data = _stream(["a", "b"], (1, 2))
    scanner, _ = _scan([data[: data.index(b"data: [DONE]")]])
    assert not scanner.done
    assert scanner.completion_tokens == 2


def test_error_event_is_noticed_and_not_counted() -> None:
    """An ``{"error": ...}`` event sets ``error`` and is not a content chunk."""
    error = _event({"error": {"message": "boom", "type": "api_error", "code": None}})
    scanner, returned = _scan([_event(_token("a")), error])
    assert (scanner.error, scanner.chunks, returned) == (True, 1, 1)


def test_unparseable_event_is_malformed() -> None:
    """A data line that looks like usage but is not JSON marks the stream malformed."""
    scanner, _ = _scan([b'data: {"usage": oops\n\n'])
    assert scanner.malformed


def test_overlong_partial_line_is_dropped_as_malformed() -> None:
    """A line that grows past MAX_LINE_BYTES without a newline is dropped, not buffered."""
    scanner = SseScanner()
    scanner.feed(b"data: " + b"x" * (MAX_LINE_BYTES + 1))
    scanner.feed(_event(_token("after")))
    assert scanner.malformed
    assert scanner.chunks == 1


@settings(deadline=None)
@given(
    texts=st.lists(st.text(min_size=1, max_size=12), min_size=1, max_size=12),
    usage=st.none() | st.tuples(st.integers(0, 10_000), st.integers(0, 10_000)),
    crlf=st.booleans(),
    cuts=st.lists(st.integers(0, 4096), max_size=40),
)
def test_any_split_of_the_bytes_gives_the_same_accounting(
    texts: list[str], usage: tuple[int, int] | None, crlf: bool, cuts: list[int]
) -> None:
    """However the bytes are split into reads (token text of any characters, LF or CRLF
    framing), the scanner finds the same chunks, usage, finish reason and end, and the
    counts ``feed`` returns add up to the chunks."""
    data = _stream(texts, usage, crlf=crlf)
    whole, _ = _scan([data])
    split, returned = _scan(_split(data, cuts))
    assert _facts(split) == _facts(whole)
    assert _facts(whole) == (
        len(texts), True, False, False, "length",
        None if usage is None else usage[0], None if usage is None else usage[1],
    )  # fmt: skip
    assert returned == len(texts)


def test_byte_at_a_time_matches_one_read() -> None:
    """Feeding one byte at a time, with JSON-looking token text, gives the same result as
    one read of the whole stream."""
    data = _stream(["usage", '"error"', "finish_reason", "data: [DONE]"], (5, 4))
    single, returned = _scan([data[i : i + 1] for i in range(len(data))])
    whole, _ = _scan([data])
    assert _facts(single) == _facts(whole) == (4, True, False, False, "length", 5, 4)
    assert returned == 4


def test_chunks_without_generated_text_are_not_counted() -> None:
    """Chunks that carry no generated text (a role-only opener with empty content, a
    finish-only closer with an empty delta, as vLLM and the emulator send) are not
    content chunks: three tokens count as 3."""
    opener = {"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}
    closer = {"choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]}
    tokens = [_event(_token(text)) for text in ("a", "b", "c")]
    scanner, _ = _scan([_event(opener), *tokens, _event(closer), b"data: [DONE]\n\n"])
    assert (scanner.chunks, scanner.finish_reason, scanner.done) == (3, "length", True)
