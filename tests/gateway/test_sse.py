"""``sse.SseSplitter`` and ``scanner.SseScanner``: framing of an event stream into whole
events, and accounting on the side of an OpenAI one, whatever the reads' boundaries."""

from __future__ import annotations

import itertools

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from sluicegate.gateway.streams.scanner import SseScanner
from sluicegate.gateway.streams.sse import MAX_EVENT_BYTES, SseSplitter


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


class _Scan:
    """A splitter and a scanner fed the same reads, as the stream relay feeds them."""

    def __init__(self) -> None:
        self.splitter = SseSplitter()
        self.scanner = SseScanner()
        self.forwarded = b""

    def feed(self, piece: bytes) -> int:
        whole, payloads = self.splitter.feed(piece)
        self.forwarded += whole
        return self.scanner.scan_all(payloads)

    def close(self) -> bytes:
        held, payloads = self.splitter.close()
        self.scanner.scan_all(payloads)
        return held


def _scan(pieces: list[bytes]) -> tuple[SseScanner, int]:
    scan = _Scan()
    returned = sum(scan.feed(piece) for piece in pieces)
    return scan.scanner, returned


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


def test_overlong_partial_line_is_dropped_and_flagged() -> None:
    """A line that grows past MAX_EVENT_BYTES without a newline is dropped, not buffered, and
    the splitter says so; the events after it are read as usual."""
    scan = _Scan()
    scan.feed(b"data: " + b"x" * (MAX_EVENT_BYTES // 2))
    assert not scan.splitter.overflowed
    scan.feed(b"x" * (MAX_EVENT_BYTES // 2))
    assert scan.splitter.overflowed
    assert scan.splitter.close() == (b"", [])
    scan.feed(b"\n\n" + _event(_token("after")))
    assert scan.scanner.chunks == 1


def test_many_lines_without_a_blank_line_are_capped_too() -> None:
    """An event whose whole lines never end (no blank line) is capped like one long line."""
    splitter = SseSplitter()
    line = b"data: " + b"y" * 1000 + b"\n"
    for _ in range(MAX_EVENT_BYTES // len(line)):
        assert splitter.feed(line) == (b"", [])
    assert not splitter.overflowed
    splitter.feed(line)
    assert splitter.overflowed


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


def test_only_whole_events_are_released_with_their_bytes_as_received() -> None:
    """Each read releases the bytes of the events it completed, exactly as received (with
    what earlier reads left), and holds the rest; released plus held is the input."""
    data = _stream(["a", "b"], (1, 2), crlf=True)
    scan = _Scan()
    cut = data.index(b"\r\n\r\n", 20) + 3  # inside the first event's blank line
    scan.feed(data[:cut])
    assert scan.forwarded == data[: data.index(b"\r\n\r\n") + 4]
    scan.feed(data[cut:])
    assert scan.forwarded == data
    assert scan.close() == b""


def test_data_lines_of_one_event_are_joined_and_other_fields_ignored() -> None:
    """An event's data lines join with newlines (the SSE rule); ``event:``, ``id:`` and
    comment lines carry nothing; an event with no data yields no payload."""
    splitter = SseSplitter()
    whole, payloads = splitter.feed(
        b': ping\n\nevent: message\nid: 7\ndata: {"a":\ndata:  1}\n\ndata:[DONE]\n\n'
    )
    assert payloads == [b'{"a":\n1}', b"[DONE]"]
    assert whole.endswith(b"data:[DONE]\n\n")


def test_close_reads_an_event_left_without_its_blank_line_but_not_a_partial_line() -> None:
    """At the end of the stream an event whose lines are whole but whose blank line never came
    still counts; a last line without its line ending does not. The held bytes are returned
    as they came."""
    splitter = SseSplitter()
    assert splitter.feed(b"data: [DONE]\n") == (b"", [])
    assert splitter.close() == (b"data: [DONE]\n", [b"[DONE]"])
    assert splitter.feed(b"data: [DONE]") == (b"", [])
    assert splitter.close() == (b"data: [DONE]", [])


@settings(deadline=None)
@given(
    texts=st.lists(st.text(min_size=1, max_size=12), min_size=1, max_size=12),
    crlf=st.booleans(),
    cuts=st.lists(st.integers(0, 4096), max_size=40),
    truncate=st.integers(0, 4096),
)
def test_framing_loses_and_invents_nothing(
    texts: list[str], crlf: bool, cuts: list[int], truncate: int
) -> None:
    """For any stream, cut anywhere and into any reads: the released bytes and the held rest
    are the input, byte for byte, and the released bytes always end at an event boundary."""
    data = _stream(texts, (3, len(texts)), crlf=crlf)[:truncate]
    scan = _Scan()
    for piece in _split(data, cuts):
        before = len(scan.forwarded)
        scan.feed(piece)
        if len(scan.forwarded) > before:
            assert scan.forwarded.endswith((b"\n\n", b"\r\n\r\n"))
    assert scan.forwarded + scan.close() == data


def test_usage_chunks_of_each_choice_add_up_and_running_totals_do_not() -> None:
    """llama.cpp's server sends one usage chunk per choice of an ``n`` > 1 chat request,
    and a completion's usage beside each choice's last chunk: either way the choices'
    completion tokens add up, the shared prompt counts once. vLLM's continuous usage (a
    running total beside each chunk of a choice) is not added up: the latest per choice
    stands, and the final usage chunk replaces it."""
    per_choice = b"".join(
        _event({"id": "c", "choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": n}})
        for n in (3, 4, 5)
    )
    scanner, _ = _scan([_stream(["a"], None).replace(b"data: [DONE]\n\n", b"") + per_choice])
    assert (scanner.prompt_tokens, scanner.completion_tokens) == (7, 12)
    running = b"".join(
        _event({**_token("x"), "usage": {"prompt_tokens": 7, "completion_tokens": n}})
        for n in (1, 2, 3)
    )
    scanner, _ = _scan([running])
    assert (scanner.prompt_tokens, scanner.completion_tokens) == (7, 3)
    last_of_each = b"".join(
        _event({
            "choices": [{"index": i, "text": "", "finish_reason": "length"}],
            "usage": {"prompt_tokens": 7, "completion_tokens": 4},
        })
        for i in range(3)
    )  # fmt: skip
    scanner, _ = _scan([last_of_each])
    assert (scanner.prompt_tokens, scanner.completion_tokens) == (7, 12)
    final = _event(
        {"id": "c", "choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": 9}}
    )
    scanner, _ = _scan([running + final + running])
    assert (scanner.prompt_tokens, scanner.completion_tokens) == (7, 9)
