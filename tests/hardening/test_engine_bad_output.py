"""Odd values in an engine's answer (found by fuzz/fuzz_sse.py and by reading the relay):
the client gets a clean answer (relayed, or 502) and the slot is freed, never a 500 with the
slot left held.

The engine is a real HTTP server on loopback that answers every completion with a fixed
body (or, for a streamed request, a fixed event stream). Lane ``plain`` relays a
non-streamed answer as the engine sent it; lane ``reassembled`` (preemptible with
``abort``) asks the engine for a stream and rebuilds the answer with ``StreamAssembler``.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import orjson
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from sluicegate.config import parse_config
from sluicegate.gateway.app import build_app as build_gateway
from tests.gateway.gateway_harness import (
    ADMIN_KEY,
    MODEL,
    Reply,
    gateway_at,
    http_call,
    model_state,
    openai_error,
    outcomes,
    serve_in_thread,
    start_server,
    stop_servers,
)
from tests.hardening.faulty_engine import Fault, faulty_engine

BODY = """    lanes:
      - {name: plain, preemptible: never}
      - {name: reassembled, preemptible: always, preempt_action: abort}
"""
CHAT = "/v1/chat/completions"
ASK = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5}
DEEP = b"[" * 300 + b"]" * 300  # parses (orjson allows 1024 levels), re-serialises past 255
DEEPER = b"[" * 1000 + b"]" * 1000  # past Python's repr recursion limit


def _chunk(extra: bytes = b"") -> bytes:
    return (
        b'data: {"id":"c1","object":"chat.completion.chunk","created":1,"model":"tiny",'
        b'"choices":[{"index":0,"delta":{"content":" hi"},"finish_reason":null}]' + extra + b"}\n\n"
    )


def _completion(usage: bytes) -> bytes:
    return (
        b'{"id":"c1","object":"chat.completion","created":1,"model":"tiny","choices":[{"index":0,'
        b'"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}],"usage":'
        + usage
        + b"}"
    )


def _odd_engine(unary: bytes, stream: bytes) -> Starlette:
    async def complete(request: Request) -> Response:
        asked = orjson.loads(await request.body())
        if asked.get("stream"):
            return Response(stream, media_type="text/event-stream")
        return Response(unary, media_type="application/json")

    return Starlette(routes=[Route(CHAT, complete, methods=["POST"])])


@contextmanager
def _gateway(unary: bytes, stream: bytes) -> Iterator[str]:
    with (
        serve_in_thread(_odd_engine(unary, stream)) as port,
        gateway_at([port], BODY, scrape=False) as gateway,
    ):
        yield gateway.base_url


def _ask(base_url: str, lane: str, *, stream: bool = False) -> Reply:
    return http_call(
        base_url, "POST", CHAT, json={**ASK, "stream": stream},
        headers={"X-Sluicegate-Lane": lane}, timeout=10,
    )  # fmt: skip


def _settled(base_url: str) -> int:
    return int(model_state(base_url)["running"])


GOOD_STREAM = _chunk() + b"data: [DONE]\n\n"


def test_a_well_formed_engine_is_served_on_both_lanes() -> None:
    """Positive control: the odd engine with ordinary answers is served on both paths."""
    usage = b'{"prompt_tokens":3,"completion_tokens":1,"total_tokens":4}'
    with _gateway(_completion(usage), GOOD_STREAM) as base_url:
        replies = [_ask(base_url, "plain"), _ask(base_url, "reassembled")]
        assert [r.status for r in replies] == [200, 200]
        assert _settled(base_url) == 0


@pytest.mark.parametrize(
    "usage", [b'{"prompt_tokens":"abc"}', b'{"completion_tokens":[1]}', b'{"completion_tokens":-5}']
)
def test_usage_of_the_wrong_type_is_relayed_and_frees_the_slot(usage: bytes) -> None:
    """Usage counts that are not integers are ignored (the estimate is used): the answer is
    relayed, and the slot is free again."""
    with _gateway(_completion(usage), GOOD_STREAM) as base_url:
        reply = _ask(base_url, "plain")
        running = _settled(base_url)
    assert reply.status == 200, reply
    assert running == 0


# The gateway's own counts for ASK, which stand in for an engine's unusable usage.
ESTIMATED_USAGE = {"prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6}


@pytest.mark.parametrize(
    ("stream", "answer_id", "model"),
    [
        (
            _chunk(b',"usage":{"prompt_tokens":' + DEEP + b"}") + b"data: [DONE]\n\n",
            "c1",
            "tiny",
        ),
        (
            _chunk().replace(b'"id":"c1"', b'"id":' + DEEPER) + b"data: [DONE]\n\n",
            "",
            "tiny",
        ),
        (
            _chunk().replace(b'"model":"tiny"', b'"model":' + DEEPER) + b"data: [DONE]\n\n",
            "c1",
            "",
        ),
    ],
    ids=["usage-300-deep", "id-1000-deep", "model-1000-deep"],
)
def test_deeply_nested_stream_fields_are_survived_when_reassembling(
    stream: bytes, answer_id: str, model: str
) -> None:
    """A reassembled answer from a stream with absurdly nested ``usage``/``id``/``model``:
    answered 200 with the text the stream carried, the nested field dropped (an empty
    ``id``/``model``; for ``usage``, the gateway's own counts), and the slot is free again."""
    with _gateway(_completion(b"{}"), stream) as base_url:
        reply = _ask(base_url, "reassembled")
        running = _settled(base_url)
    assert reply.status == 200, reply
    body = reply.json()
    assert isinstance(body.pop("created"), int), body
    assert body == {
        "id": answer_id,
        "object": "chat.completion",
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": " hi"},
                "finish_reason": "stop",
            }
        ],
        "usage": ESTIMATED_USAGE,
    }
    assert running == 0


@pytest.mark.parametrize(
    "stream",
    [
        _chunk(b',"usage":{"prompt_tokens":' + DEEP + b"}") + b"data: [DONE]\n\n",
        _chunk(b',"usage":{"prompt_tokens":"abc","completion_tokens":-5}') + b"data: [DONE]\n\n",
        _chunk().replace(b'"id":"c1"', b'"id":' + DEEPER) + b"data: [DONE]\n\n",
    ],
    ids=["usage-300-deep", "usage-wrong-types", "id-1000-deep"],
)
def test_odd_streams_are_relayed_to_a_streaming_client(stream: bytes) -> None:
    """A streamed request relays the events as they came (SseScanner only counts them) and
    frees the slot, whatever the events hold."""
    with _gateway(_completion(b"{}"), stream) as base_url:
        reply = _ask(base_url, "plain", stream=True)
        running = _settled(base_url)
    assert reply.status == 200, reply
    assert reply.body == stream
    assert running == 0


# ------------------------------------------------------------------ reassembled failures

FAILING = """    max_concurrency: 8
    circuit_failures: 1
    circuit_cooldown_s: 600
    adaptive: {mode: aimd}
    lanes:
      - {name: plain, preemptible: never}
      - {name: reassembled, preemptible: always, preempt_action: abort}
"""
ROUTES = [
    pytest.param("emulator", "reassembled", id="abort-lane"),
    pytest.param("llamacpp", "plain", id="llamacpp-backend"),
]


@contextmanager
def _failing_gateway(engine_port: int, engine_kind: str) -> Iterator[str]:
    """A gateway whose one backend (of ``engine_kind``) opens its circuit at the first
    failure and whose aimd limit starts at 8."""
    text = (
        f"models:\n  - name: {MODEL}\n    backends:\n"
        f"      - {{name: e0, url: 'http://127.0.0.1:{engine_port}', engine: {engine_kind}}}\n"
        + FAILING
    )
    app = build_gateway(parse_config(text), environ={"SLUICEGATE_ADMIN_KEY": ADMIN_KEY})
    running = start_server(app)
    try:
        yield f"http://127.0.0.1:{running.port}"
    finally:
        stop_servers([running])


@pytest.mark.parametrize(("engine_kind", "lane"), ROUTES)
@pytest.mark.parametrize(
    "fault", [Fault.ERROR_EVENT, Fault.MALFORMED_STREAM], ids=["error-event", "malformed"]
)
def test_a_failed_stream_behind_a_non_streamed_request_is_an_engine_failure(
    engine_kind: str, lane: str, fault: Fault
) -> None:
    """A non-streamed request that the gateway sends upstream as a stream (a lane that may
    preempt with ``abort``, or a llama.cpp backend) whose stream carries an engine error
    event, or an event that is not JSON, after a first chunk: the client gets the unary
    path's 502 ``upstream_error`` (not 200 with the text cut off), and the failure is
    heard: counted ``upstream_error``, the circuit opens (``circuit_failures: 1``), the aimd
    limit drops from 8 to 7, and the slot is free."""
    with faulty_engine(fault) as engine, _failing_gateway(engine.port, engine_kind) as base_url:
        reply = _ask(base_url, lane)
        asked_stream = [seen.stream for seen in engine.received]
        state = model_state(base_url)
        counted = outcomes(base_url)
    assert asked_stream == [True]
    assert reply.status == 502, reply
    assert openai_error(reply)["code"] == "upstream_error"
    assert counted == {"upstream_error": 1}
    assert state["backends"][0]["circuit"] == "open"
    assert state["cap"] == 7
    assert state["running"] == 0


@pytest.mark.parametrize(("engine_kind", "lane"), ROUTES)
def test_a_healthy_stream_behind_a_non_streamed_request_is_reassembled(
    engine_kind: str, lane: str
) -> None:
    """Positive control for the test above: the same engine without a fault gives 200 with
    the whole text, a closed circuit and an unchanged limit."""
    with faulty_engine() as engine, _failing_gateway(engine.port, engine_kind) as base_url:
        reply = _ask(base_url, lane)
        state = model_state(base_url)
        counted = outcomes(base_url)
    assert reply.status == 200, reply
    assert reply.json()["choices"][0]["message"]["content"] == "tok" * engine.chunks
    assert counted == {"completed": 1}
    assert state["backends"][0]["circuit"] == "closed"
    assert state["cap"] == 8
