"""``StreamAssembler``: the non-streaming answer an OpenAI event stream amounts to, built
cheaply (deltas shaped like the first plain one are not parsed, long runs of them are read in
bulk) and exactly what parsing every event gives, however the stream was cut."""

from __future__ import annotations

import itertools
import json
from typing import Any

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from sluicegate.gateway.streams.assemble import StreamAssembler, streamable_copy


def _event(payload: object) -> bytes:
    return b"data: " + orjson.dumps(payload) + b"\n\n"


def _chat_stream(texts: list[str], *, usage: bool = True) -> bytes:
    """vLLM's shape: a role opener with empty content, one delta per token, a finish closer
    with an empty delta, a usage chunk, ``[DONE]``."""
    head = {"id": "chatcmpl-7", "object": "chat.completion.chunk", "created": 1, "model": "m"}
    opener = {"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}
    events = [_event({**head, "choices": [opener]})]
    for text in texts:
        delta = {"index": 0, "delta": {"content": text}, "finish_reason": None}
        events.append(_event({**head, "choices": [delta]}))
    events.append(
        _event({**head, "choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]})
    )
    if usage:
        counts = {
            "prompt_tokens": 9,
            "completion_tokens": len(texts),
            "total_tokens": 9 + len(texts),
        }
        events.append(_event({**head, "choices": [], "usage": counts}))
    events.append(b"data: [DONE]\n\n")
    return b"".join(events)


def _assembled(pieces: list[bytes], endpoint: str = "chat") -> StreamAssembler:
    assembler = StreamAssembler("chat" if endpoint == "chat" else "completions")
    for piece in pieces:
        assembler.feed(piece)
    assembler.close()
    return assembler


def _body(assembler: StreamAssembler, **options: Any) -> dict[str, Any]:
    body = orjson.loads(assembler.body(prompt_tokens=4, **options))
    assert isinstance(body, dict)
    return body


def test_a_vllm_chat_stream_becomes_its_completion() -> None:
    """Text joined, the stream's finish reason, id, model and usage; counted chunks exclude
    the opener and the closer."""
    assembler = _assembled([_chat_stream(["Hel", "lo", ' "wörld"\n'])])
    assert (assembler.chunks, assembler.done, assembler.error) == (3, True, False)
    body = _body(assembler)
    assert body == {
        "id": "chatcmpl-7", "object": "chat.completion", "created": assembler.created,
        "model": "m",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": 'Hello "wörld"\n'},
                     "finish_reason": "length"}],
        "usage": {"prompt_tokens": 9, "completion_tokens": 3, "total_tokens": 12},
    }  # fmt: skip
    assert not assembler.malformed


def test_a_parsed_event_followed_by_done_is_not_malformed() -> None:
    """A content event without a ``finish_reason`` and then ``[DONE]``: the body holds its
    text and ``[DONE]`` is not taken for a broken delta (found by fuzz_sse)."""
    event = {"id": "c", "choices": [{"index": 0, "delta": {"content": "hi"}}]}
    assembler = _assembled([_event(event) + b"data: [DONE]\n\n"])
    assert _body(assembler)["choices"][0]["message"]["content"] == "hi"
    assert not assembler.malformed


def test_spaced_json_as_llama_cpp_writes_it_gives_the_same_text() -> None:
    """Events written with spaces after colons (as Python's ``json`` writes them) give the same
    text and counts as compact ones."""
    compact = _chat_stream(["a", "b"], usage=False)
    spaced = compact.replace(b'":', b'": ').replace(b"data: ", b"data: ")
    one, two = _assembled([compact]), _assembled([spaced])
    assert _body(one)["choices"] == _body(two)["choices"]
    assert (one.chunks, two.chunks) == (2, 2)


def test_completions_stream_gives_text_and_counts_usage_without_one() -> None:
    """A completions stream without a usage chunk: ``text``, and usage from the prompt tokens
    given and the non-empty chunks."""
    head = {"id": "cmpl-1", "object": "text_completion", "model": "m"}
    stream = b"".join(
        _event({**head, "choices": [{"index": 0, "text": text, "finish_reason": finish}]})
        for text, finish in (("x", None), ("y", None), ("", "stop"))
    )
    body = _body(_assembled([stream + b"data: [DONE]\n\n"], "completions"))
    assert body["choices"] == [{"index": 0, "text": "xy", "finish_reason": "stop"}]
    assert body["usage"] == {"prompt_tokens": 4, "completion_tokens": 2, "total_tokens": 6}


def test_a_preempted_body_overrides_the_finish_and_falls_back_for_ids() -> None:
    """``finish_reason="preempted"`` wins and usage is recounted; an empty stream's body takes
    the fallback id and model."""
    partial = _chat_stream(["a", "b", "c"])
    body = _body(_assembled([partial[: partial.index(b"length")]]), finish_reason="preempted")
    assert body["choices"][0]["finish_reason"] == "preempted"
    assert body["usage"] == {"prompt_tokens": 4, "completion_tokens": 3, "total_tokens": 7}
    empty = _body(StreamAssembler("chat"), fallback_id="t1", fallback_model="tiny")
    assert (empty["id"], empty["model"]) == ("t1", "tiny")
    assert empty["choices"][0]["message"]["content"] == ""


def test_error_and_malformed_events_are_reported() -> None:
    """An error event sets ``error``; an event that is not JSON is left out of the text and
    marks the stream ``malformed``."""
    error = _event({"error": {"message": "boom", "type": "server_error", "code": None}})
    opener = _chat_stream(["a"]).split(b"\n\n")[0] + b"\n\n"
    assert _assembled([opener, error]).error
    assert not _assembled([opener]).error
    broken = b'data: {"choices":[{"delta":{"content":"lost"},"finish_reason":null}\n\n'
    good = _chat_stream(["a"], usage=False).replace(b"data: [DONE]", b"")
    assert not _assembled([good]).malformed
    assembler = _assembled([good, broken])
    assert assembler.malformed
    assert _body(assembler)["choices"][0]["message"]["content"] == "a"


def test_streamable_copy_asks_for_a_stream_with_usage_unless_it_cannot_merge() -> None:
    """A plain request is rewritten to stream with usage, ``n`` > 1 too; tools are not."""
    copy = streamable_copy(b'{"model":"m","messages":[]}')
    assert copy is not None
    assert orjson.loads(copy)["stream_options"] == {"include_usage": True}
    several = streamable_copy(b'{"model":"m","n":2}')
    assert several is not None
    assert orjson.loads(several)["n"] == 2
    assert streamable_copy(b'{"model":"m","tools":[]}') is None


@settings(deadline=None)
@given(
    texts=st.lists(st.text(min_size=1, max_size=8), min_size=1, max_size=10),
    cuts=st.lists(st.integers(0, 3000), max_size=30),
    crlf=st.booleans(),
)
def test_any_split_gives_the_same_answer(texts: list[str], cuts: list[int], crlf: bool) -> None:
    """However the stream is cut into reads (LF or CRLF), the answer is the same, and its
    text is the tokens joined."""
    data = _chat_stream(texts)
    if crlf:
        data = data.replace(b"\n", b"\r\n")
    bounds = [0, *sorted({min(cut, len(data)) for cut in cuts}), len(data)]
    split = _assembled([data[a:b] for a, b in itertools.pairwise(bounds)])
    whole = _assembled([data])
    whole.created = split.created  # each assembler stamps its own second; they may differ
    assert _body(split) == _body(whole)
    assert _body(whole)["choices"][0]["message"]["content"] == "".join(texts)
    assert (split.chunks, split.done, split.malformed) == (len(texts), True, False)


def _reference(stream: bytes) -> tuple[str, str | None, object, str, str]:
    """What every event of a (well-formed, LF) stream says, each parsed: (text, last finish
    reason, last usage, last id, last model), as the assembler must find it."""
    text, finish, usage, last_id, model = "", None, None, "", ""
    for line in stream.split(b"\n"):
        payload = line[5:].strip()
        if not line.startswith(b"data:") or payload == b"[DONE]":
            continue
        event = orjson.loads(payload)
        last_id = event.get("id") or last_id
        model = event.get("model") or model
        if isinstance(event.get("usage"), dict):
            usage = event["usage"]
        choices = event.get("choices") or [{}]
        delta = choices[0].get("delta") or {}
        text += delta.get("content") or ""
        finish = choices[0].get("finish_reason") or finish
    return text, finish, usage, last_id, model


_ODD_DELTAS = st.sampled_from(
    [
        {"role": "assistant", "content": "R"},  # content not alone in the delta
        {"content": "x", "reasoning_content": None},
        {},
    ]
)
_TEXTS = st.text(
    alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",)), min_size=0, max_size=6
)


@settings(deadline=None, max_examples=60)
@given(
    mixed=st.lists(st.one_of(_TEXTS, _ODD_DELTAS), min_size=1, max_size=60),
    run=st.tuples(st.integers(0, 60), st.integers(0, 400), _TEXTS),
    finish_at=st.integers(0, 460),
    spaced=st.booleans(),
    read_size=st.sampled_from([None, 7, 200, 5000, 40_000]),
)
def test_the_answer_is_what_every_event_says(
    mixed: list[str | dict[str, object]],
    run: tuple[int, int, str],
    finish_at: int,
    spaced: bool,
    read_size: int | None,
) -> None:
    """Whatever the mix of plain deltas (any text, escapes included), odd ones (role with
    content, extra keys, empty), a finish reason mid-stream, compact or spaced JSON, and reads
    of any size, and a long run of like deltas somewhere (so that it is read in bulk): the
    answer holds exactly the text, finish reason, usage, id and model that parsing every
    event gives."""
    at, length, text = run
    deltas = [*mixed[:at], *[text] * length, *mixed[at:]]
    events = []
    for i, delta in enumerate(deltas):
        body = {"content": delta} if isinstance(delta, str) else delta
        choice = {"index": 0, "delta": body, "finish_reason": "length" if i == finish_at else None}
        event = {"id": f"c{i // 50}", "model": "m", "choices": [choice]}
        events.append(event)
    events.append({"id": "c-last", "choices": [], "usage": {"prompt_tokens": 1}})
    dumped = [json.dumps(e).encode() if spaced else orjson.dumps(e) for e in events]
    stream = b"".join(b"data: " + e + b"\n\n" for e in dumped) + b"data: [DONE]\n\n"
    reads = [stream] if read_size is None else [
        stream[i : i + read_size] for i in range(0, len(stream), read_size)
    ]  # fmt: skip
    assembler = _assembled(reads)
    text, finish, usage, last_id, model = _reference(stream)
    body = _body(assembler)
    assert body["choices"][0]["message"]["content"] == text
    assert body["choices"][0]["finish_reason"] == (finish or "stop")
    assert body["usage"] == usage
    assert (body["id"], body["model"]) == (last_id, model)
    assert (assembler.done, assembler.error, assembler.malformed) == (True, False, False)
    assert assembler.chunks == sum(
        1 for d in deltas if d and (not isinstance(d, dict) or d.get("content"))
    )


def test_a_template_shaped_event_with_a_broken_string_is_malformed() -> None:
    """An event that matches the plain delta's shape but whose string is not valid JSON (a
    bad escape) is not taken as text: the stream is malformed, in a short stream and in one
    long enough to be read in bulk."""
    good = _event(
        {"id": "c", "choices": [{"index": 0, "delta": {"content": "ok"}, "finish_reason": None}]}
    )
    bad = good.replace(b'"ok"', b'"\\x"')
    for filler in (1, 300):
        stream = good * filler + bad + good + b"data: [DONE]\n\n"
        assembler = _assembled([stream[i : i + 100] for i in range(0, len(stream), 100)])
        assert assembler.malformed, filler
