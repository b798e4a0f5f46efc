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

from sluicegate.gateway.assemble import StreamAssembler, streamable_copy


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
    """A plain request is rewritten to stream with usage; ``n`` ≠ 1 or tools are not."""
    copy = streamable_copy(b'{"model":"m","messages":[]}')
    assert copy is not None
    assert orjson.loads(copy)["stream_options"] == {"include_usage": True}
    assert streamable_copy(b'{"model":"m","n":2}') is None
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


_PIECES = st.lists(_TEXTS, max_size=6)
_TOP_EXTRAS = st.fixed_dictionaries(
    {},
    optional={
        "system_fingerprint": st.sampled_from(["fp_44709d6fcb", None]),
        "service_tier": st.just("default"),
        "prompt_logprobs": st.none(),
    },
)


@st.composite
def _completions(draw: st.DrawFn, endpoint: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """A non-streamed answer an engine might give, and the chunks it streams it as (vLLM's
    and OpenAI's shapes: a role opener, reasoning deltas, content deltas with their log
    probabilities, tool call deltas by index, a closer, a usage chunk)."""
    head = {"id": "chatcmpl-" + draw(st.text("abc123", min_size=1, max_size=6)),
            "created": draw(st.integers(0, 2**31)), "model": "m", **draw(_TOP_EXTRAS)}  # fmt: skip
    pieces, reason = draw(_PIECES), draw(st.sampled_from(["stop", "length", "tool_calls"]))
    with_logprobs = draw(st.booleans()) and bool(pieces)  # (none if no token came)
    stop_reason = draw(st.sampled_from([None, "\n", 7]))
    entries = [{"token": p, "logprob": -0.5, "bytes": list(p.encode())[:3], "top_logprobs": []}
               for p in pieces]  # fmt: skip
    usage: dict[str, Any] = {"prompt_tokens": 9, "completion_tokens": len(pieces),
                             "total_tokens": 9 + len(pieces)}  # fmt: skip
    usage.update(draw(st.fixed_dictionaries({}, optional={
        "prompt_tokens_details": st.builds(dict, cached_tokens=st.integers(0, 9)),
        "completion_tokens_details": st.builds(dict, reasoning_tokens=st.integers(0, 9)),
    })))  # fmt: skip
    choice: dict[str, Any] = {"index": 0}
    chunks: list[dict[str, Any]] = []

    def chunk(delta: dict[str, Any], **own: Any) -> None:
        part = {"index": 0, **delta} if endpoint == "completions" else {"index": 0, "delta": delta}
        part.update({"logprobs": None, "finish_reason": None, "stop_reason": None, **own})
        chunks.append({**head, "object": "chunk", "choices": [part]})

    if endpoint == "completions":
        for piece, entry in zip(pieces, entries, strict=True):
            lp = {"tokens": [piece], "token_logprobs": [entry["logprob"]]}
            chunk({"text": piece}, logprobs=lp if with_logprobs else None)
        logprobs = {"tokens": pieces, "token_logprobs": [e["logprob"] for e in entries]}
        choice["text"] = "".join(pieces)
    else:
        calls = draw(st.lists(st.tuples(st.text("fgh", min_size=1), _PIECES), max_size=2))
        message: dict[str, Any] = {"role": "assistant", "content": "".join(pieces)}
        if calls and not pieces:
            message["content"] = None
        chunk({"role": "assistant", "content": message["content"] and ""})
        for field in draw(st.sets(st.sampled_from(["reasoning_content", "reasoning"]))):
            thoughts = draw(st.lists(_TEXTS, min_size=1, max_size=6))
            message[field] = "".join(thoughts)
            for thought in thoughts:
                chunk({field: thought})
        for piece, entry in zip(pieces, entries, strict=True):
            chunk({"content": piece}, logprobs={"content": [entry]} if with_logprobs else None)
        if calls:
            message["tool_calls"] = []
        for index, (name, args) in enumerate(calls):
            call = {"id": f"call_{index}", "type": "function"}
            chunk({"tool_calls": [{"index": index, **call,
                                   "function": {"name": name, "arguments": ""}}]})  # fmt: skip
            for arg in args:
                chunk({"tool_calls": [{"index": index, "function": {"arguments": arg}}]})
            message["tool_calls"].append(
                {**call, "function": {"name": name, "arguments": "".join(args)}}
            )
        choice["message"] = message
        logprobs = {"content": entries}
    chunk({}, finish_reason=reason, stop_reason=stop_reason)
    chunks.append({**head, "object": "chunk", "choices": [], "usage": usage})
    choice.update(logprobs=logprobs if with_logprobs else None, finish_reason=reason,
                  stop_reason=stop_reason)  # fmt: skip
    kind = "chat.completion" if endpoint == "chat" else "text_completion"
    answer = {**head, "object": kind, "choices": [choice], "usage": usage}
    return answer, chunks


@settings(deadline=None, max_examples=150)
@given(
    endpoint_and_answer=st.sampled_from(["chat", "completions"]).flatmap(
        lambda endpoint: st.tuples(st.just(endpoint), _completions(endpoint))
    ),
    read_size=st.sampled_from([None, 5, 64, 4096]),
    spaced=st.booleans(),
)
def test_the_answer_equals_the_non_streamed_one_field_by_field(
    endpoint_and_answer: tuple[str, tuple[dict[str, Any], list[dict[str, Any]]]],
    read_size: int | None,
    spaced: bool,
) -> None:
    """A random non-streamed answer (top-level extras such as ``system_fingerprint``, usage
    details such as ``prompt_tokens_details.cached_tokens``, reasoning, tool calls, log
    probabilities, ``stop_reason``), streamed as an engine streams it and read in reads of
    any size: the rebuilt answer is the non-streamed one, every field equal."""
    endpoint, (answer, chunks) = endpoint_and_answer
    dumped = [json.dumps(c).encode() if spaced else orjson.dumps(c) for c in chunks]
    stream = b"".join(b"data: " + c + b"\n\n" for c in dumped) + b"data: [DONE]\n\n"
    size = read_size or len(stream)
    assembler = _assembled([stream[i : i + size] for i in range(0, len(stream), size)], endpoint)
    assert (assembler.done, assembler.error, assembler.malformed) == (True, False, False)
    assert _body(assembler) == answer


def test_a_long_reasoning_then_content_stream_keeps_both_in_order() -> None:
    """300 reasoning deltas then 300 content deltas, read in bulk (each run through the
    template): ``reasoning_content`` and ``content`` each whole and in order, every delta
    counted as output."""
    head = {"id": "c", "object": "chat.completion.chunk", "created": 5, "model": "m",
            "system_fingerprint": "fp_1"}  # fmt: skip

    def delta(field: str, text: str) -> bytes:
        return _event({**head, "choices": [{"index": 0, "delta": {field: text},
                                            "finish_reason": None}]})  # fmt: skip

    thoughts = [f"t{i} " for i in range(300)]
    words = [f"w{i} " for i in range(300)]
    stream = b"".join(
        [delta("role", "assistant")]
        + [delta("reasoning_content", t) for t in thoughts]
        + [delta("content", w) for w in words]
        + [b"data: [DONE]\n\n"]
    )
    reads = [stream[:200]] + [stream[i : i + 20_000] for i in range(200, len(stream), 20_000)]
    assembler = _assembled(reads)
    body = _body(assembler)
    assert body["choices"][0]["message"] == {
        "role": "assistant", "reasoning_content": "".join(thoughts), "content": "".join(words)
    }  # fmt: skip
    assert (body["system_fingerprint"], body["created"]) == ("fp_1", 5)
    assert assembler.chunks == 600
