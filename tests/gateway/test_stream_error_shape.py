"""An engine's error event mid-stream reaches the client in OpenAI's shape, whatever the
engine's own shape, with the text before it intact; the request ends as an engine failure.
The engine is a real server on loopback that streams a vLLM (< 0.10) or TGI error."""

from __future__ import annotations

import orjson
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from sluicegate.config import parse_config
from sluicegate.gateway.app import build_app as build_gateway
from sluicegate.gateway.streams.sse import payloads_of
from tests.gateway.gateway_harness import (
    ADMIN_KEY,
    MODEL,
    http_call,
    outcomes,
    start_server,
    stop_servers,
)

CHUNK = (
    b'data: {"id":"x","object":"chat.completion.chunk","created":0,"model":"tiny",'
    b'"choices":[{"index":0,"delta":{"content":"Hello"},"finish_reason":null}]}\n\n'
)
ERRORS = {
    "vllm": b'data: {"object":"error","message":"The engine failed","type":"InternalServerError",'
    b'"param":null,"code":500}\n\ndata: [DONE]\n\n',
    "tgi": b'data: {"error":{"message":"CUDA out of memory","http_status_code":500}}\n\n'
    b"data: [DONE]\n\n",
}
MESSAGES = {"vllm": "The engine failed", "tgi": "CUDA out of memory"}


@pytest.mark.parametrize("engine", sorted(ERRORS))
def test_the_engines_error_event_is_rewritten_in_openais_shape(engine: str) -> None:
    """The client reads the engine's first chunk unchanged, then an error event whose
    ``error`` has a message (the engine's), a type, a string code and ``param``, then
    ``[DONE]``; the gateway counts an upstream error."""

    async def chat(request: Request) -> Response:
        return Response(CHUNK + ERRORS[engine], media_type="text/event-stream")

    running = [
        start_server(Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"])]))
    ]
    try:
        url = f"http://127.0.0.1:{running[0].port}"
        config = parse_config(
            f"models:\n  - name: {MODEL}\n    backends:\n"
            f"      - {{name: e0, url: '{url}', engine: {engine}}}\n"
        )
        env = {"SLUICEGATE_ADMIN_KEY": ADMIN_KEY}
        running.append(start_server(build_gateway(config, environ=env, scrape=False)))
        base = f"http://127.0.0.1:{running[-1].port}"
        body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "stream": True}
        reply = http_call(base, "POST", "/v1/chat/completions", json=body)
        counted = outcomes(base)
    finally:
        stop_servers(running)
    assert reply.status == 200
    payloads = payloads_of(reply.body)
    assert payloads[0] == CHUNK[len(b"data: ") : -2]
    error = orjson.loads(payloads[1])["error"]
    assert error == {
        "message": MESSAGES[engine], "type": "api_error", "code": "upstream_error", "param": None
    }  # fmt: skip
    assert payloads[2:] == [b"[DONE]"]
    assert counted.get("upstream_error", 0) == 1
