"""What llama-cpp-python's server really does with the tiny model, asked directly (no
gateway): it loads and answers, and it has the quirks the gateway must absorb. Pinned here
so that the gateway's handling of each quirk stays justified as the engine changes."""

from __future__ import annotations

import asyncio
import time

import aiohttp
import orjson
import pytest
from openai.types.chat import ChatCompletionMessageParam

from tests.gateway.gateway_harness import MODEL, http_call, wait_until
from tests.realengine.llama_server import LlamaServer, require_llama_cpp
from tests.realengine.realengine_client import (
    completion_body,
    data_payloads,
    engine_answers_within,
    post_broken_json,
    sdk_client,
    stalled_stream,
    token_count,
    wait_engine_idle,
)

require_llama_cpp()
pytestmark = pytest.mark.realengine

from tests.realengine.tiny_gguf import chatml  # noqa: E402

MESSAGES: list[ChatCompletionMessageParam] = [{"role": "user", "content": "Say something."}]
# ~6 MB of streamed chunks: more than the loopback socket buffers hold (~1.5-3 MB).
STALLED_TOKENS = 1500


def test_chat_uses_the_models_chat_template_and_counts_its_tokens(
    llama_engine: LlamaServer,
) -> None:
    """A chat answer runs to max_tokens in printable ASCII; its prompt tokens are the
    engine's count of the ChatML rendering of the messages."""
    with sdk_client(llama_engine.url) as client:
        answer = client.chat.completions.create(
            model=MODEL, messages=MESSAGES, max_tokens=12, temperature=0.0
        )
    content = answer.choices[0].message.content or ""
    assert answer.choices[0].finish_reason == "length"
    assert answer.usage is not None
    assert answer.usage.completion_tokens == 12
    assert answer.usage.prompt_tokens == token_count(llama_engine.url, chatml(MESSAGES))
    assert content
    assert content.isascii()
    assert content.isprintable()


def test_streamed_answers_carry_no_usage_even_when_asked(llama_engine: LlamaServer) -> None:
    """``stream_options.include_usage`` is ignored: no chunk has usage; there is one text
    chunk per generated token."""
    body = {**completion_body("Count me.", 20, stream=True),
            "stream_options": {"include_usage": True}}  # fmt: skip
    reply = http_call(llama_engine.url, "POST", "/v1/completions", json=body)
    payloads = data_payloads(reply.body)
    assert reply.status == 200
    assert payloads[-1] == b"[DONE]"
    assert not any(b'"usage"' in payload for payload in payloads)
    texts = [orjson.loads(p)["choices"][0]["text"] for p in payloads[:-1]]
    assert sum(1 for text in texts if text) == 20


def test_streamed_prompt_too_long_is_an_empty_200_stream(llama_engine: LlamaServer) -> None:
    """A streamed prompt longer than the context window: 200, an event stream, no events."""
    body = completion_body("x" * 5000, 5, stream=True)
    reply = http_call(llama_engine.url, "POST", "/v1/completions", json=body)
    assert reply.status == 200
    assert reply.headers["content-type"].startswith("text/event-stream")
    assert data_payloads(reply.body) == []


def test_unary_prompt_too_long_is_an_openai_400(llama_engine: LlamaServer) -> None:
    """The same prompt unstreamed: a 400 ``context_length_exceeded``."""
    reply = http_call(
        llama_engine.url, "POST", "/v1/completions", json=completion_body("x" * 5000, 5)
    )
    assert reply.status == 400
    assert reply.json()["error"]["code"] == "context_length_exceeded"


def test_invalid_json_is_a_plain_text_500(llama_engine: LlamaServer) -> None:
    """A body that is not JSON gets ``Internal Server Error`` as text/plain."""
    reply = post_broken_json(llama_engine.url)
    assert reply.status == 500
    assert reply.headers["content-type"].startswith("text/plain")


def test_a_field_of_the_wrong_type_is_a_500(llama_engine: LlamaServer) -> None:
    """A client's mistake (``temperature: "hot"``) is answered as a server error."""
    body = {**completion_body("hi", 3), "temperature": "hot"}
    reply = http_call(llama_engine.url, "POST", "/v1/completions", json=body)
    assert reply.status == 500


def test_there_is_no_health_or_metrics_endpoint(llama_engine: LlamaServer) -> None:
    """``/health`` and ``/metrics`` are 404."""
    assert http_call(llama_engine.url, "GET", "/health").status == 404
    assert http_call(llama_engine.url, "GET", "/metrics").status == 404


def test_a_request_id_that_is_not_a_uuid_is_refused_with_an_empty_400(
    llama_engine: LlamaServer,
) -> None:
    """``X-Request-Id`` must be a UUID (32 hex digits); anything else is an empty 400."""
    body = completion_body("hi", 3)
    refused = http_call(llama_engine.url, "POST", "/v1/completions", json=body,
                        headers={"X-Request-Id": "1f2e-7"})  # fmt: skip
    accepted = http_call(llama_engine.url, "POST", "/v1/completions", json=body,
                         headers={"X-Request-Id": "0" * 31 + "7"})  # fmt: skip
    assert (refused.status, refused.body) == (400, b"")
    assert accepted.status == 200


async def test_requests_are_served_one_at_a_time(llama_engine: LlamaServer) -> None:
    """Two streams sent together: the second's first token comes after the first's end."""
    url = llama_engine.url + "/v1/completions"

    async def run(session: aiohttp.ClientSession, name: str) -> tuple[float, float]:
        async with session.post(url, json=completion_body(name, 200, stream=True)) as reply:
            assert reply.status == 200
            payloads = [await _next_payload(reply)]
            first = time.monotonic()
            while payloads[-1] != b"[DONE]":
                payloads.append(await _next_payload(reply))
            return first, time.monotonic()

    async with aiohttp.ClientSession() as session:
        first = asyncio.ensure_future(run(session, "first"))
        await asyncio.sleep(0.05)
        (_, first_done), (second_started, _) = await asyncio.gather(first, run(session, "second"))
    # Had they overlapped, the second's first token would come ~0.05 s after the first's.
    assert second_started >= first_done - 0.05


async def _next_payload(reply: aiohttp.ClientResponse) -> bytes:
    while True:
        line = await reply.content.readline()
        assert line, "the stream ended without [DONE]"
        if line.startswith(b"data:"):
            return line[5:].strip()


def test_a_client_that_stops_reading_holds_the_engine_until_it_closes(
    llama_engine: LlamaServer,
) -> None:
    """A streaming client that stops reading without closing: once the socket buffers are
    full the engine stops computing yet stays busy (stuck behind the client), and it is
    freed only when the client closes."""
    sock = stalled_stream(llama_engine.port, STALLED_TOKENS)
    try:
        stuck = wait_until(lambda: _stuck(llama_engine), 15.0, every_s=0.0)
    finally:
        sock.close()
    freed = wait_engine_idle(llama_engine.url, 10.0)
    assert stuck, "the engine never got stuck behind the stalled client"
    assert freed is not None
    assert freed < 1.0


def _stuck(engine: LlamaServer) -> bool:
    """Busy (its lock held) but not computing: under 0.05 s of CPU in 0.5 s."""
    before = engine.cpu_s()
    time.sleep(0.5)
    return engine.cpu_s() - before < 0.05 and not engine_answers_within(engine.url, 0.3)
