"""Errors against llama.cpp through the gateway: a prompt longer than the context is a clear
400 or a clean error event, what the engine cannot parse never reaches a client as it is,
and a client's mistake never counts against the engine's circuit."""

from __future__ import annotations

import time
from collections.abc import Iterator

import openai
import pytest

from tests.gateway.gateway_harness import MODEL, Stack, backend_state, http_call, openai_error
from tests.realengine.llama_server import N_CTX, require_llama_cpp
from tests.realengine.realengine_client import (
    completion_body,
    data_payloads,
    error_of,
    post_broken_json,
    sdk_client,
)
from tests.realengine.realengine_stack import GatewayFactory

require_llama_cpp()
pytestmark = pytest.mark.realengine

TOO_LONG = "x" * (N_CTX + 100)  # one token a character
TWO_STRIKES = "    circuit_failures: 2\n    circuit_cooldown_s: 30\n"
# Nested deeper than Python's json module recurses: orjson (the gateway) parses it, the
# engine answers a plain-text 500.
DEEP = 1000
DEEPLY_NESTED = (
    b'{"model":"tiny","prompt":"hi","max_tokens":3,"x":' + b"[" * DEEP + b"]" * DEEP + b"}"
)


@pytest.fixture
def gateway(gateway_for: GatewayFactory) -> Iterator[Stack]:
    """A gateway whose circuit opens after two consecutive engine failures."""
    with gateway_for(TWO_STRIKES, scrape=False) as stack:
        yield stack


@pytest.mark.parametrize("endpoint", ["chat", "completions"])
def test_unary_prompt_too_long_is_a_400_context_length_exceeded(
    gateway: Stack, endpoint: str
) -> None:
    """The SDK gets a BadRequestError naming the context length."""
    with sdk_client(gateway.base_url) as client, pytest.raises(openai.BadRequestError) as caught:
        _ask_too_long(client, endpoint)
    assert caught.value.code == "context_length_exceeded"
    assert str(N_CTX) in caught.value.message


def _ask_too_long(client: openai.OpenAI, endpoint: str) -> None:
    if endpoint == "chat":
        client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": TOO_LONG}], max_tokens=4
        )
    else:
        client.completions.create(model=MODEL, prompt=TOO_LONG, max_tokens=4)


def test_streamed_prompt_too_long_ends_with_an_error_event(gateway: Stack) -> None:
    """The engine's empty 200 stream reaches the client as one ``empty_stream`` error event
    then [DONE], promptly (the SDK raises an APIError)."""
    body = completion_body(TOO_LONG, 4, stream=True)
    start = time.monotonic()
    reply = http_call(gateway.base_url, "POST", "/v1/completions", json=body)
    took = time.monotonic() - start
    payloads = data_payloads(reply.body)
    assert reply.status == 200
    assert len(payloads) == 2, payloads
    error = error_of(payloads)
    assert error is not None, payloads
    assert error["code"] == "empty_stream", error
    assert payloads[-1] == b"[DONE]"
    assert took < 5.0
    with sdk_client(gateway.base_url) as client, pytest.raises(openai.APIError):
        list(client.completions.create(model=MODEL, prompt=TOO_LONG, max_tokens=4, stream=True))


def test_streamed_prompts_too_long_do_not_open_the_circuit(gateway: Stack) -> None:
    """Three over-long streams (the circuit opens after two engine failures) leave the
    circuit closed, and the next request is served."""
    body = completion_body(TOO_LONG, 4, stream=True)
    for _ in range(3):
        http_call(gateway.base_url, "POST", "/v1/completions", json=body)
    reply = http_call(gateway.base_url, "POST", "/v1/completions", json=completion_body("ok", 4))
    assert backend_state(gateway.base_url, "llama")["circuit"] == "closed"
    assert reply.status == 200


def test_unary_prompt_too_long_in_a_lane_streamed_upstream_is_a_400(gateway: Stack) -> None:
    """A non-streamed request in a lane that preempts with ``abort`` (the gateway streams it
    from the engine): an over-long prompt is still a 400 context_length_exceeded."""
    reply = http_call(
        gateway.base_url, "POST", "/v1/completions", json=completion_body(TOO_LONG, 4),
        headers={"X-Sluicegate-Lane": "batch"},
    )  # fmt: skip
    assert reply.status == 400
    assert openai_error(reply)["code"] == "context_length_exceeded"


def test_invalid_json_is_refused_by_the_gateway(gateway: Stack) -> None:
    """A body that is not JSON is the gateway's own OpenAI-shaped 400, never the engine's
    plain-text 500."""
    reply = post_broken_json(gateway.base_url)
    assert reply.status == 400
    assert openai_error(reply)["code"] == "invalid_json"


@pytest.mark.parametrize(
    "body",
    [
        b'{"model":"tiny","prompt":"hi","max_tokens":3,"temperature":"hot"}',
        DEEPLY_NESTED,
    ],
    ids=["wrong-type", "too-deep"],
)
def test_a_malformed_request_is_a_400_and_spares_the_circuit(gateway: Stack, body: bytes) -> None:
    """Requests the engine would answer with a 500 are the client's fault: each is a 400,
    the circuit stays closed and the next good request is served."""
    headers = {"Content-Type": "application/json"}
    statuses = [
        http_call(gateway.base_url, "POST", "/v1/completions", body=body, headers=headers).status
        for _ in range(3)
    ]
    reply = http_call(gateway.base_url, "POST", "/v1/completions", json=completion_body("ok", 4))
    assert statuses == [400] * 3
    assert backend_state(gateway.base_url, "llama")["circuit"] == "closed"
    assert reply.status == 200
