"""Reassembly keeps every field the engine sent (``gateway/streams/assemble_fields.py``): a random
non-streamed answer, streamed as engines stream it, is rebuilt field by field — top-level
extras, usage details, reasoning, tool calls, log probabilities and ``n`` choices."""

from __future__ import annotations

import json
from typing import Any

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.gateway.test_assemble import _TEXTS, _assembled, _body, _event

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


@settings(deadline=None, max_examples=100)
@given(
    texts=st.lists(st.lists(_TEXTS, min_size=1, max_size=5), min_size=1, max_size=4),
    order=st.randoms(use_true_random=False),
    usage_mode=st.sampled_from(["once", "chunk per choice", "beside each finish"]),
    read_size=st.sampled_from([None, 9, 300]),
)
def test_n_choices_interleaved_become_n_choices_with_all_their_tokens(
    texts: list[list[str]], order: Any, usage_mode: str, read_size: int | None
) -> None:
    """``n`` choices streamed interleaved (each by its index, as vLLM and llama.cpp's
    server send them): one choice per index, each with its own text and finish reason;
    usage sent once for all (vLLM) is kept, usage sent once per choice (llama.cpp's
    server: a usage chunk per choice for chat, beside each choice's last chunk for a
    completion) adds up to every choice's tokens with the prompt counted once."""
    head = {"id": "c", "object": "chat.completion.chunk", "created": 3, "model": "m"}

    def event(index: int, delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        choice = {"index": index, "delta": delta, "finish_reason": finish}
        return {**head, "choices": [choice]}

    def usage_of(count: int) -> dict[str, Any]:
        return {"prompt_tokens": 7, "completion_tokens": count, "total_tokens": 7 + count,
                "prompt_tokens_details": {"cached_tokens": 2}}  # fmt: skip

    queues = [
        [event(i, {"role": "assistant", "content": ""})]
        + [event(i, {"content": t}) for t in pieces]
        + [event(i, {}, "length" if i % 2 else "stop")]
        for i, pieces in enumerate(texts)
    ]
    counts = [len(pieces) for pieces in texts]
    if usage_mode == "beside each finish":
        for queue, count in zip(queues, counts, strict=True):
            queue[-1]["usage"] = usage_of(count)
    events = []
    while any(queues):
        events.append(order.choice([q for q in queues if q]).pop(0))
    if usage_mode == "chunk per choice":
        events += [{**head, "choices": [], "usage": usage_of(count)} for count in counts]
    elif usage_mode == "once":
        events.append({**head, "choices": [], "usage": usage_of(sum(counts))})
    stream = b"".join(_event(e) for e in events) + b"data: [DONE]\n\n"
    size = read_size or len(stream)
    body = _body(_assembled([stream[i : i + size] for i in range(0, len(stream), size)]))
    assert body["choices"] == [
        {"index": i, "message": {"role": "assistant", "content": "".join(pieces)},
         "finish_reason": "length" if i % 2 else "stop"}
        for i, pieces in enumerate(texts)
    ]  # fmt: skip
    assert body["usage"] == {
        "prompt_tokens": 7, "completion_tokens": sum(counts), "total_tokens": 7 + sum(counts),
        "prompt_tokens_details": {"cached_tokens": 2},
    }  # fmt: skip


def test_fields_nested_deeper_than_orjson_writes_are_left_out() -> None:
    """An engine's extra field nested 300 deep (orjson reads it, writes at most 255): the
    answer is still built, with its text, id, finish and token counts, without the
    fields the assembler does not read."""
    deep: Any = "x"
    for _ in range(300):
        deep = [deep]
    head = {"id": "c", "object": "chat.completion.chunk", "model": "m", "odd": deep}
    usage = {"prompt_tokens": 2, "completion_tokens": 1, "prompt_tokens_details": deep}
    events = [
        {**head, "choices": [{"index": 0, "delta": {"content": "hi"}, "finish_reason": None}]},
        {**head, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]},
        {**head, "choices": [], "usage": usage},
    ]
    # Python's json writes it (orjson would not): as an engine written in Python could.
    stream = b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in events)
    body = _body(_assembled([stream + b"data: [DONE]\n\n"]))
    assert "odd" not in body
    assert body["choices"] == [
        {"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}
    ]
    assert body["usage"] == {"prompt_tokens": 2, "completion_tokens": 1}
