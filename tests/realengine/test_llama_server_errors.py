"""Errors from llama.cpp's own server (``llama-server``) through the gateway: a prompt longer
than a slot's context is a prompt 400 whether streamed or not, what the engine would take
wrongly (or answer with a 500) the gateway refuses first, what only the engine checks comes
back as a 4xx, and none of it counts against the engine's circuit."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import openai
import pytest

from tests.gateway.gateway_harness import MODEL, Stack, backend_state, http_call, openai_error
from tests.realengine.llama_cpp_server import LlamaCppServer
from tests.realengine.realengine_client import completion_body, post_broken_json, sdk_client
from tests.realengine.realengine_stack import GatewayFactory

pytestmark = pytest.mark.realengine

SLOT_CONTEXT = 2048  # -c 8192 over --parallel 4
TOO_LONG = "x" * (SLOT_CONTEXT + 52)  # one token a character, no BOS: 2100 tokens
TWO_STRIKES = "    circuit_failures: 2\n    circuit_cooldown_s: 30\n"
BACKEND = "llama-0"


@pytest.fixture
def gateway(gateway_for_llama_cpp: GatewayFactory) -> Iterator[Stack]:
    """A gateway whose circuit opens after two consecutive engine failures."""
    with gateway_for_llama_cpp(TWO_STRIKES, scrape=False) as stack:
        yield stack


def _ask_too_long(client: openai.OpenAI, endpoint: str, *, stream: bool) -> None:
    if endpoint == "chat":
        answer: Any = client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": TOO_LONG}], max_tokens=4,
            stream=stream,
        )  # fmt: skip
    else:
        answer = client.completions.create(
            model=MODEL, prompt=TOO_LONG, max_tokens=4, stream=stream
        )
    if stream:
        list(answer)


def _served_after(gateway: Stack) -> bool:
    """Whether the circuit is closed and a good request is served."""
    reply = http_call(gateway.base_url, "POST", "/v1/completions", json=completion_body("ok", 4))
    return backend_state(gateway.base_url, BACKEND)["circuit"] == "closed" and reply.status == 200


@pytest.mark.parametrize("endpoint", ["chat", "completions"])
@pytest.mark.parametrize("stream", [False, True], ids=["unary", "stream"])
def test_prompt_too_long_is_a_400_naming_the_context(
    gateway: Stack, endpoint: str, stream: bool
) -> None:
    """Streamed or not (llama-server checks the prompt before it starts a stream), the SDK
    gets a BadRequestError naming the slot's context, at once; three of them leave the
    circuit closed."""
    with sdk_client(gateway.base_url) as client:
        for _ in range(3):
            start = time.monotonic()
            with pytest.raises(openai.BadRequestError) as caught:
                _ask_too_long(client, endpoint, stream=stream)
            assert time.monotonic() - start < 5.0
            assert f"({SLOT_CONTEXT} tokens)" in caught.value.message
    assert _served_after(gateway)


def test_prompt_too_long_in_a_lane_streamed_upstream_is_a_400(gateway: Stack) -> None:
    """A non-streamed request in a lane that preempts with ``abort`` (the gateway streams it
    from the engine and reassembles it) still gets the engine's 400."""
    reply = http_call(
        gateway.base_url, "POST", "/v1/completions", json=completion_body(TOO_LONG, 4),
        headers={"X-Sluicegate-Lane": "batch"},
    )  # fmt: skip
    assert reply.status == 400, reply
    assert b"exceeds the available context size" in reply.body


@pytest.mark.parametrize("stream", [False, True], ids=["unary", "stream"])
def test_prompt_too_long_error_is_openai_shaped(gateway: Stack, stream: bool) -> None:
    """The 400 is OpenAI's: code ``context_length_exceeded`` (a string), a ``param``."""
    body = completion_body(TOO_LONG, 4, stream=stream)
    reply = http_call(gateway.base_url, "POST", "/v1/completions", json=body)
    assert reply.status == 400
    error = openai_error(reply)
    assert error["code"] == "context_length_exceeded", error
    assert error["type"] == "invalid_request_error", error


def test_generation_stops_where_the_slot_context_ends(gateway: Stack) -> None:
    """A prompt near the slot's context with a huge max_tokens: the answer ends when the
    context is full (prompt + completion = 2048 tokens), finish_reason ``length``."""
    with sdk_client(gateway.base_url) as client:
        answer = client.completions.create(
            model=MODEL, prompt="x" * 2040, max_tokens=1_000_000, temperature=0.0
        )
    assert answer.choices[0].finish_reason == "length"
    assert answer.usage is not None
    assert (answer.usage.prompt_tokens, answer.usage.total_tokens) == (2040, SLOT_CONTEXT)


# Each body, sent to llama-server itself, is taken wrongly or answered with a 500: noted
# beside it. The gateway refuses it first, naming the field (param).
REFUSED_BY_THE_GATEWAY: dict[str, tuple[str, dict[str, Any], int, str | None]] = {
    # engine: 400, its own shape
    "temperature-type": ("completions", {"prompt": "hi", "temperature": "hot"}, 400, "temperature"),
    # engine: 400, its own shape
    "max-tokens-type": ("completions", {"prompt": "hi", "max_tokens": "3"}, 400, "max_tokens"),
    # engine: generates one token
    "max-tokens-0": ("completions", {"prompt": "hi", "max_tokens": 0}, 400, "max_tokens"),
    # engine: generates until the slot's context is full
    "max-tokens-negative": ("completions", {"prompt": "hi", "max_tokens": -1}, 400, "max_tokens"),
    # engine: above the gateway's own limit
    "max-tokens-huge": ("completions", {"prompt": "hi", "max_tokens": 10**8}, 400, "max_tokens"),
    # engine: ignores it
    "stop-type": ("completions", {"prompt": "hi", "stop": 7}, 400, "stop"),
    # engine: 400, its own shape
    "prompt-type": ("completions", {"prompt": 5}, 400, "prompt"),
    # engine: answers anyway (it serves one model, whatever the name)
    "unknown-model": ("completions", {"prompt": "hi", "model": "nope"}, 404, None),
    # engine: answers anyway (an empty prompt)
    "empty-messages": ("chat", {"messages": []}, 400, "messages"),
}


@pytest.mark.parametrize("case", list(REFUSED_BY_THE_GATEWAY))
def test_bad_input_is_refused_by_the_gateway(gateway: Stack, case: str) -> None:
    """The gateway's own OpenAI-shaped error, naming the field; the circuit stays closed."""
    endpoint, fields, status, param = REFUSED_BY_THE_GATEWAY[case]
    path = "/v1/chat/completions" if endpoint == "chat" else "/v1/completions"
    body = {"model": MODEL, "max_tokens": 3, **fields}
    for _ in range(3):
        reply = http_call(gateway.base_url, "POST", path, json=body)
        assert reply.status == status, reply
        assert openai_error(reply)["param"] == param
    assert _served_after(gateway)


def test_invalid_json_is_refused_by_the_gateway(gateway: Stack) -> None:
    """A body that is not JSON (llama-server: a 500) is the gateway's 400 ``invalid_json``."""
    reply = post_broken_json(gateway.base_url)
    assert reply.status == 400
    assert openai_error(reply)["code"] == "invalid_json"


# What only llama-server checks: its 400 reaches the client.
CHECKED_BY_THE_ENGINE = {
    "bad-grammar": ({"grammar": "root ::= ("}, "failed to parse grammar"),
    "logprobs-type": ({"logprobs": "x"}, "Field 'logprobs'"),
    "include-usage-type": (
        {"stream": True, "stream_options": {"include_usage": "yes"}},
        "Field 'include_usage'",
    ),
}


def _complete(client: openai.OpenAI, fields: dict[str, Any]) -> None:
    """A completion of ``hi`` with ``fields`` added, read to its end if streamed."""
    answer: Any = client.completions.create(
        model=MODEL, prompt="hi", max_tokens=3, extra_body=fields
    )
    if fields.get("stream"):
        list(answer)


@pytest.mark.parametrize("case", list(CHECKED_BY_THE_ENGINE))
def test_input_only_the_engine_checks_is_its_400(gateway: Stack, case: str) -> None:
    """The engine's 400 (its message) reaches the SDK as a BadRequestError; three of them
    leave the circuit closed."""
    fields, message = CHECKED_BY_THE_ENGINE[case]
    with sdk_client(gateway.base_url) as client:
        for _ in range(3):
            with pytest.raises(openai.BadRequestError) as caught:
                _complete(client, fields)
            assert message in caught.value.message
    assert _served_after(gateway)


def test_the_engines_400_is_openai_shaped(gateway: Stack) -> None:
    """The engine's 400 reaches the client in OpenAI's shape, its message kept."""
    body = {**completion_body("hi", 3), "grammar": "root ::= ("}
    reply = http_call(gateway.base_url, "POST", "/v1/completions", json=body)
    assert reply.status == 400
    error = openai_error(reply)
    assert error["type"] == "invalid_request_error", error
    assert "failed to parse grammar" in error["message"]


def test_more_choices_than_slots_are_the_gateways_400(gateway: Stack) -> None:
    """``n`` above the engine's slots (``--parallel 4``, the backend's cap): the gateway's
    own 400 naming ``n`` (the engine would refuse it too), before it reaches the engine."""
    body = {**completion_body("hi", 3), "n": 5}
    reply = http_call(gateway.base_url, "POST", "/v1/completions", json=body)
    assert reply.status == 400
    error = openai_error(reply)
    assert (error["code"], error["param"]) == ("invalid_request", "n")
    assert "at most 4" in error["message"]


@pytest.mark.parametrize(
    "message", [{"content": "hi"}, {"role": 5, "content": "hi"}], ids=["missing", "number"]
)
def test_message_without_a_role_string_is_a_400_and_spares_the_circuit(
    gateway: Stack, message: dict[str, object]
) -> None:
    """A message whose ``role`` is missing or not a string (llama-server: a 500 "Failed to
    parse messages") is the gateway's 400 naming it; three of them leave the circuit closed."""
    body = {"model": MODEL, "max_tokens": 3, "messages": [message]}
    for _ in range(3):
        reply = http_call(gateway.base_url, "POST", "/v1/chat/completions", json=body)
        assert reply.status == 400, reply
        assert openai_error(reply)["param"] == "messages[0].role"
    assert _served_after(gateway)


IMAGE = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}


def test_an_image_for_a_text_only_model_spares_the_circuit(gateway: Stack) -> None:
    """An image part sent to a llama-server without a vision projector (which answers a
    500 "image input is not supported") is the client's mistake: a 4xx, and three of them
    leave the circuit closed."""
    body = {
        "model": MODEL, "max_tokens": 3,
        "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}, IMAGE]}],
    }  # fmt: skip
    for _ in range(3):
        reply = http_call(gateway.base_url, "POST", "/v1/chat/completions", json=body)
        assert 400 <= reply.status < 500, reply
    assert _served_after(gateway)


@pytest.mark.parametrize(
    "sampling", [{"temperature": -1.0}, {"top_p": 2.0}], ids=["temperature", "top-p"]
)
def test_out_of_range_sampling_is_clamped_by_the_engine(
    llama_cpp: LlamaCppServer, gateway: Stack, sampling: dict[str, float]
) -> None:
    """llama-server clamps out-of-range sampling values instead of refusing them
    (temperature -1 is 0: greedy); the gateway passes them on, and the answer is the
    greedy one."""
    greedy = http_call(llama_cpp.url, "POST", "/v1/completions", json=completion_body("hi", 8))
    body = {**completion_body("hi", 8), **sampling}
    if "temperature" not in sampling:
        body["temperature"] = 0.0
    reply = http_call(gateway.base_url, "POST", "/v1/completions", json=body)
    assert reply.status == 200, reply
    assert reply.json()["choices"][0]["text"] == greedy.json()["choices"][0]["text"]


def test_empty_prompt_is_an_empty_answer(gateway: Stack) -> None:
    """An empty prompt is an empty answer with zero usage (vLLM refuses it): relayed."""
    reply = http_call(gateway.base_url, "POST", "/v1/completions", json=completion_body("", 3))
    assert reply.status == 200, reply
    answer = reply.json()
    assert answer["choices"][0]["text"] == ""
    assert answer["usage"]["completion_tokens"] == 0


def test_embeddings_not_enabled_is_a_501_and_spares_the_circuit(gateway: Stack) -> None:
    """Embeddings from a llama-server started without ``--embeddings``: the client gets a
    501 ``not_supported`` in OpenAI's shape, three of them leave the circuit closed."""
    body = {"model": MODEL, "input": "hi"}
    for _ in range(3):
        reply = http_call(gateway.base_url, "POST", "/v1/embeddings", json=body)
        assert reply.status == 501, reply
        assert openai_error(reply)["code"] == "not_supported"
    assert _served_after(gateway)
