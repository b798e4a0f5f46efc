"""``priority_passthrough``: the engine's priority field carries the ticket's sluicegate
priority (capped for the tenant, as admission used it), on streamed and non-streamed
requests alike; without it the body goes as it came. Checked on the wire: the engine is a
real server on loopback that keeps the bodies it is sent."""

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
from tests.gateway.gateway_harness import ADMIN_KEY, MODEL, http_call, start_server, stop_servers

ANSWER = {
    "id": "x", "object": "chat.completion", "created": 0, "model": MODEL,
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"},
                 "finish_reason": "stop"}],
    "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
}  # fmt: skip
STREAM = (
    b'data: {"id":"x","object":"chat.completion.chunk","created":0,"model":"tiny",'
    b'"choices":[{"index":0,"delta":{"content":"ok"},"finish_reason":"stop"}]}\n\n'
    b"data: [DONE]\n\n"
)


@contextmanager
def recording_gateway(passthrough: bool) -> Iterator[tuple[str, list[dict[str, object]]]]:
    """A gateway in front of an engine that records every body; the gateway's URL and the
    bodies."""
    bodies: list[dict[str, object]] = []

    async def chat(request: Request) -> Response:
        body = orjson.loads(await request.body())
        bodies.append(body)
        if body.get("stream"):
            return Response(STREAM, media_type="text/event-stream")
        return Response(orjson.dumps(ANSWER), media_type="application/json")

    running = [
        start_server(Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"])]))
    ]
    try:
        engine = f"http://127.0.0.1:{running[0].port}"
        config = parse_config(
            f"models:\n  - name: {MODEL}\n    backends:\n      - {{name: e0, url: '{engine}',"
            f" engine: vllm, priority_passthrough: {str(passthrough).lower()}}}\n"
            "tenants:\n  - {name: t, api_key_env: T_KEY, default_priority: 4, max_priority: 3}\n"
        )
        env = {"SLUICEGATE_ADMIN_KEY": ADMIN_KEY, "T_KEY": "tenant-key"}
        running.append(start_server(build_gateway(config, environ=env, scrape=False)))
        yield f"http://127.0.0.1:{running[-1].port}", bodies
    finally:
        stop_servers(running)


def _send(base_url: str, *, stream: bool, priority: int | None) -> None:
    body: dict[str, object] = {
        "model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2,
        "stream": stream,
    }  # fmt: skip
    if priority is not None:
        body["priority"] = priority
    reply = http_call(base_url, "POST", "/v1/chat/completions", json=body, key="tenant-key")
    assert reply.status == 200, reply


@pytest.mark.parametrize("stream", [False, True])
def test_the_engine_gets_the_tickets_priority(stream: bool) -> None:
    """The tenant's default (4) when the request names none; a more important one asked
    for (0) is capped at the tenant's ``max_priority`` (3), as admission capped it."""
    with recording_gateway(passthrough=True) as (base, bodies):
        _send(base, stream=stream, priority=None)
        _send(base, stream=stream, priority=0)
        _send(base, stream=stream, priority=5)
    assert [body["priority"] for body in bodies] == [4, 3, 5]
    assert all(body["messages"] == [{"role": "user", "content": "hi"}] for body in bodies)


@pytest.mark.parametrize("stream", [False, True])
def test_without_passthrough_the_engine_never_sees_a_priority(stream: bool) -> None:
    """No field is added, and the client's ``priority`` (sluicegate's, read at admission)
    is taken out: vLLM refuses a non-zero one unless started with its priority scheduler,
    and one that has it must not be steered past the tenant's cap. The rest of the body
    is the client's."""
    with recording_gateway(passthrough=False) as (base, bodies):
        _send(base, stream=stream, priority=None)
        _send(base, stream=stream, priority=0)
    assert all("priority" not in body for body in bodies)
    assert all(body["messages"] == [{"role": "user", "content": "hi"}] for body in bodies)


def test_passthrough_to_an_engine_without_a_priority_scheduler_is_refused() -> None:
    """llama-server schedules by slot only: the setting would do nothing, so it is an error
    naming the backend."""
    with pytest.raises(ValueError, match=r"backends\[e0\]\.priority_passthrough"):
        parse_config(
            "models:\n  - name: m\n    backends:\n      - {name: e0, url: 'http://127.0.0.1:1',"
            " engine: llama-server, priority_passthrough: true}\n"
        )


def test_a_stale_bound_within_one_scrape_is_refused() -> None:
    """``metrics_stale_after_s`` no longer than the scrape interval would mark every backend
    full between two scrapes: an error naming both settings."""
    with pytest.raises(ValueError, match=r"metrics_stale_after_s.*scrape_interval_s"):
        parse_config(
            "server: {scrape_interval_s: 2.0}\nmodels:\n  - name: m\n"
            "    metrics_stale_after_s: 1.5\n    backends: [{name: b, url: 'http://127.0.0.1:1'}]\n"
        )
