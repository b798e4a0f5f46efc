"""Every refusal is an OpenAI-shaped error with the right status, type, code and param."""

from __future__ import annotations

import http.client
from collections.abc import Iterator

import openai
import orjson
import pytest

from tests.gateway.gateway_harness import (
    MODEL,
    Reply,
    Stack,
    assert_retry_headers,
    engine_config,
    engine_stats,
    gateway_at,
    http_call,
    model_state,
    openai_error,
    stack,
    unused_port,
    wait_until,
)

KEY = "sk-canary-4f1d9a7e-errors"
BODY = """    lanes:
      - {name: interactive}
      - {name: batch}
tenants:
  - {name: a, api_key_env: KEY_A, allowed_lanes: [interactive]}
server: {max_body_bytes: 2048}
"""
CHAT = "/v1/chat/completions"
GOOD = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


@pytest.fixture(scope="module")
def gateway() -> Iterator[Stack]:
    """A gateway whose one tenant may use only the interactive lane; bodies ≤ 2048 bytes."""
    with stack(BODY, environ={"KEY_A": KEY}) as live:
        yield live


def _post(
    gateway: Stack,
    *,
    json: object = None,
    body: bytes | None = None,
    headers: dict[str, str] | None = None,
) -> Reply:
    """POST to the chat endpoint with the tenant's key."""
    all_headers = {"Content-Type": "application/json", **(headers or {})}
    return http_call(
        gateway.base_url, "POST", CHAT, json=json, body=body, key=KEY, headers=all_headers
    )


def test_unknown_key_is_401(gateway: Stack) -> None:
    """A bearer key no tenant owns → 401 ``invalid_api_key``, type authentication_error."""
    reply = http_call(gateway.base_url, "POST", CHAT, json=GOOD, key="sk-nobody")
    assert reply.status == 401
    error = openai_error(reply)
    assert (error["type"], error["code"]) == ("authentication_error", "invalid_api_key")


def test_missing_key_is_401(gateway: Stack) -> None:
    """No Authorization header at all → 401 ``invalid_api_key``."""
    reply = http_call(gateway.base_url, "POST", CHAT, json=GOOD)
    assert reply.status == 401
    assert openai_error(reply)["code"] == "invalid_api_key"


def test_sdk_raises_authentication_error_for_unknown_key(gateway: Stack) -> None:
    """The SDK sees the 401 as ``AuthenticationError`` carrying the gateway's error object."""
    with (
        openai.OpenAI(base_url=gateway.base_url + "/v1", api_key="sk-nobody", max_retries=0) as sdk,
        pytest.raises(openai.AuthenticationError) as caught,
    ):
        sdk.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x"}])
    assert isinstance(caught.value.body, dict)
    assert caught.value.body["code"] == "invalid_api_key"


def test_unknown_model_is_404(gateway: Stack) -> None:
    """A model the config does not name → 404 ``model_not_found``, type not_found_error."""
    reply = _post(gateway, json={**GOOD, "model": "gpt-nonexistent"})
    assert reply.status == 404
    error = openai_error(reply)
    assert (error["type"], error["code"]) == ("not_found_error", "model_not_found")


def test_lane_the_tenant_may_not_use_is_403(gateway: Stack) -> None:
    """An existing lane outside the tenant's ``allowed_lanes`` → 403 ``lane_not_allowed``."""
    reply = _post(gateway, json=GOOD, headers={"X-Sluicegate-Lane": "batch"})
    assert reply.status == 403
    error = openai_error(reply)
    assert (error["type"], error["code"]) == ("permission_error", "lane_not_allowed")


def test_unknown_lane_is_400(gateway: Stack) -> None:
    """A lane the model does not have → 400 ``invalid_lane``."""
    reply = _post(gateway, json=GOOD, headers={"X-Sluicegate-Lane": "express"})
    assert reply.status == 400
    error = openai_error(reply)
    assert (error["type"], error["code"]) == ("invalid_request_error", "invalid_lane")


def test_malformed_json_is_400(gateway: Stack) -> None:
    """A body that is not JSON → 400 ``invalid_json``."""
    reply = _post(gateway, body=b'{"model": "tiny", "messages": [')
    assert reply.status == 400
    error = openai_error(reply)
    assert (error["type"], error["code"]) == ("invalid_request_error", "invalid_json")


def test_body_that_is_not_an_object_is_400(gateway: Stack) -> None:
    """Valid JSON that is not an object (here a list) → 400."""
    reply = _post(gateway, json=[GOOD])
    assert reply.status == 400
    assert openai_error(reply)["type"] == "invalid_request_error"


@pytest.mark.parametrize("value", ["10", -1, 0, 2.5, True])
def test_bad_max_tokens_is_400_naming_the_param(gateway: Stack, value: object) -> None:
    """``max_tokens`` that is not a positive integer → 400 with ``param: "max_tokens"``."""
    reply = _post(gateway, json={**GOOD, "max_tokens": value})
    assert reply.status == 400
    error = openai_error(reply)
    assert error["param"] == "max_tokens"
    assert "max_tokens" in error["message"]


def test_declared_oversized_body_is_413(gateway: Stack) -> None:
    """A Content-Length over ``server.max_body_bytes`` → 413 ``request_too_large``."""
    big = {**GOOD, "messages": [{"role": "user", "content": "x" * 4096}]}
    reply = _post(gateway, json=big)
    assert reply.status == 413
    error = openai_error(reply)
    assert (error["type"], error["code"]) == ("invalid_request_error", "request_too_large")


def test_chunked_oversized_body_is_413(gateway: Stack) -> None:
    """A chunked body with no Content-Length is cut off at the cap too → 413."""
    host, port = "127.0.0.1", gateway.gateway_port
    connection = http.client.HTTPConnection(host, port, timeout=10)
    try:
        chunks = iter([b'{"model": "tiny", "prompt": "', b"x" * 1500, b"y" * 1500, b'"}'])
        headers = {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"}
        connection.request("POST", "/v1/completions", body=chunks, headers=headers,
                           encode_chunked=True)  # fmt: skip
        response = connection.getresponse()
        reply = Reply(response.status, {k.lower(): v for k, v in response.getheaders()},
                      response.read())  # fmt: skip
    finally:
        connection.close()
    assert reply.status == 413
    assert openai_error(reply)["code"] == "request_too_large"


def test_unknown_path_is_an_openai_shaped_404(gateway: Stack) -> None:
    """A path the gateway does not serve → 404 in OpenAI's shape."""
    reply = http_call(gateway.base_url, "POST", "/v1/responses", json=GOOD, key=KEY)
    assert reply.status == 404
    assert openai_error(reply)["type"] == "not_found_error"


def test_wrong_method_is_an_openai_shaped_405(gateway: Stack) -> None:
    """GET on a POST-only endpoint → 405 ``method_not_allowed`` in OpenAI's shape."""
    reply = http_call(gateway.base_url, "GET", CHAT, key=KEY)
    assert reply.status == 405
    assert openai_error(reply)["code"] == "method_not_allowed"


def test_api_key_never_appears_in_an_error(gateway: Stack) -> None:
    """No error answer echoes the API key presented in Authorization, known or unknown,
    in its body or headers."""
    unknown = "sk-canary-0b5e-unknown"
    big = {**GOOD, "messages": [{"role": "user", "content": "x" * 4096}]}
    replies = [
        http_call(gateway.base_url, "POST", CHAT, json=GOOD, key=unknown),
        http_call(gateway.base_url, "POST", CHAT, json=GOOD, headers={"Authorization": unknown}),
        _post(gateway, json={**GOOD, "model": "gpt-nonexistent"}),
        _post(gateway, json={**GOOD, "max_tokens": "10"}),
        _post(gateway, json=GOOD, headers={"X-Sluicegate-Lane": "batch"}),
        _post(gateway, body=b"{not json"),
        _post(gateway, json=big),
        http_call(gateway.base_url, "GET", "/admin/state", key=KEY),
        http_call(gateway.base_url, "GET", "/v1/nothing-here", key=KEY),
    ]
    for reply in replies:
        assert reply.status >= 400, reply
        for secret in (KEY, unknown):
            assert secret.encode() not in reply.body, reply
            assert all(secret not in value for value in reply.headers.values()), reply


# ------------------------------------------------------------------ upstream failures

LONG_PROMPT = {"model": MODEL, "prompt": "x" * 140_000, "max_tokens": 5}  # > the KV capacity
HI = {"model": MODEL, "prompt": "hi", "max_tokens": 50, "ignore_eos": True}


@pytest.mark.parametrize("stream", [False, True], ids=["unary", "stream"])
def test_engine_refusal_is_relayed_with_its_status_and_body(stream: bool) -> None:
    """An engine's own 4xx (here a prompt beyond its context) reaches the client with the
    engine's status and error body, streamed request or not."""
    with stack() as gateway:
        reply = http_call(
            gateway.base_url, "POST", "/v1/completions", json={**LONG_PROMPT, "stream": stream}
        )
    assert reply.status == 400
    error = openai_error(reply)
    assert (error["code"], error["param"]) == ("context_length_exceeded", "prompt")


def test_unreachable_engine_is_503_no_healthy_backend_not_502() -> None:
    """A backend nothing listens on (no probes to notice it first): the refused request was
    never sent, so it is not a 502; with no other backend it gets 503
    ``no_healthy_backend`` in OpenAI's shape, with retry headers."""
    with gateway_at([unused_port()], scrape=False) as gateway:
        reply = http_call(gateway.base_url, "POST", "/v1/completions", json=HI)
    assert reply.status == 503
    error = openai_error(reply)
    assert (error["type"], error["code"]) == ("service_unavailable_error", "no_healthy_backend")
    assert_retry_headers(reply)


def test_a_refused_connection_opens_the_circuit_at_once() -> None:
    """One refused connection marks the backend down, whatever ``circuit_failures`` says:
    the next requests get 503 ``no_healthy_backend`` with retry headers, none a 502."""
    with gateway_at([unused_port()], "    circuit_failures: 2\n", scrape=False) as gateway:
        statuses = [
            http_call(gateway.base_url, "POST", "/v1/completions", json=HI).status for _ in range(2)
        ]
        reply = http_call(gateway.base_url, "POST", "/v1/completions", json=HI)
    assert statuses == [503, 503]
    assert reply.status == 503
    assert openai_error(reply)["code"] == "no_healthy_backend"
    assert_retry_headers(reply)


def test_failed_health_probe_refuses_with_503_no_healthy_backend() -> None:
    """Once the health probe finds the only backend down, requests get 503
    ``no_healthy_backend`` with retry headers and ``/readyz`` is 503."""
    body = "server: {scrape_interval_s: 0.1}\n"
    with gateway_at([unused_port()], body) as gateway:
        assert wait_until(lambda: http_call(gateway.base_url, "GET", "/readyz").status == 503, 2.0)
        reply = http_call(gateway.base_url, "POST", "/v1/completions", json=HI)
    assert reply.status == 503
    assert openai_error(reply)["code"] == "no_healthy_backend"
    assert_retry_headers(reply)


def test_engine_slower_than_the_read_timeout_is_504_and_aborted() -> None:
    """A non-streamed answer slower than ``upstream_idle_timeout_s`` → 504
    ``upstream_timeout``; the engine request is aborted and the slot freed."""
    body = "server: {upstream_first_byte_timeout_s: 0.3}\n"
    with stack(body, engine=engine_config(base_s=0.05)) as gateway:
        reply = http_call(gateway.base_url, "POST", "/v1/completions", json=HI)
        aborted = wait_until(lambda: engine_stats(gateway.engine_url())["aborted_total"] == 1, 1.0)
        running = model_state(gateway.base_url)["running"]
    assert reply.status == 504
    error = openai_error(reply)
    assert (error["type"], error["code"]) == ("timeout_error", "upstream_timeout")
    assert aborted
    assert running == 0


def test_stalled_stream_ends_with_an_error_event_and_done() -> None:
    """A stream whose engine goes silent past the idle timeout ends with an OpenAI-shaped
    ``upstream_timeout`` event and ``[DONE]``; the engine request is aborted."""
    body = "server: {upstream_idle_timeout_s: 0.2}\n"
    with stack(body, engine=engine_config(base_s=0.4)) as gateway:
        reply = http_call(gateway.base_url, "POST", "/v1/completions", json={**HI, "stream": True})
        aborted = wait_until(lambda: engine_stats(gateway.engine_url())["aborted_total"] == 1, 1.0)
    events = [line[6:] for line in reply.body.split(b"\n\n") if line.startswith(b"data: ")]
    assert reply.status == 200
    assert events[-1] == b"[DONE]"
    error = orjson.loads(events[-2])["error"]
    assert (error["code"], error["type"]) == ("upstream_timeout", "api_error")
    assert aborted
