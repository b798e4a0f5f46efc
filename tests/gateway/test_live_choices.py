"""``n`` choices through a live gateway: ``n`` units of concurrency, ``n`` > what can run
at once refused, and completion tokens counted for every choice whether the engine's usage
covers them all (vLLM, the emulator) or one choice each (llama.cpp's server, imitated by a
real server on loopback that answers as its ``n`` > 1 code does)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from typing import Any

import aiohttp
import orjson
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from sluicegate.config import parse_config
from sluicegate.gateway.app import build_app as build_gateway
from tests.gateway.gateway_harness import (
    ADMIN_KEY,
    MODEL,
    Stack,
    http_call,
    metric,
    model_state,
    serve_in_thread,
    stack,
    start_server,
    stop_servers,
    wait_until,
)

CAPPED = """    max_concurrency: 4
    lanes:
      - {name: interactive, max_concurrency: 4, preemptible: never}
"""


def _completion_tokens(base_url: str) -> float:
    return metric(base_url, "sluicegate_tokens_total", model=MODEL, kind="completion") or 0.0


async def _post(
    session: aiohttp.ClientSession, base_url: str, body: dict[str, Any]
) -> tuple[int, dict[str, Any]]:
    async with session.post(base_url + "/v1/completions", json={"model": MODEL, **body}) as reply:
        return reply.status, orjson.loads(await reply.read())


async def test_n_choices_take_n_units_and_wait_for_them() -> None:
    """Cap 4: a running n = 3 request holds 3 units (the engine runs 3 sequences); an n = 2
    request then waits in the queue instead of taking the engine to 5; once the first is
    gone it runs and answers its 2 choices."""
    with stack(CAPPED) as gateway:
        url = gateway.base_url
        engine = f"http://127.0.0.1:{gateway.engine_ports[0]}"
        async with aiohttp.ClientSession() as session:
            long = {"prompt": "hold", "max_tokens": 20_000, "ignore_eos": True, "n": 3}
            first = asyncio.ensure_future(_post(session, url, long))
            assert await asyncio.to_thread(
                wait_until, lambda: model_state(url)["running"] == 3, 10.0
            )
            short = {"prompt": "two", "max_tokens": 4, "ignore_eos": True, "n": 2}
            second = asyncio.ensure_future(_post(session, url, short))
            assert await asyncio.to_thread(
                wait_until, lambda: model_state(url)["queued"] == 1, 10.0
            )
            await asyncio.sleep(0.3)
            assert (model_state(url)["running"], model_state(url)["queued"]) == (3, 1)
            engine_running = http_call(engine, "GET", "/emulator/stats").json()["running"]
            assert engine_running == 3
            first.cancel()
            await asyncio.gather(first, return_exceptions=True)
            status, body = await asyncio.wait_for(second, 30)
    assert status == 200, body
    assert [c["index"] for c in body["choices"]] == [0, 1]
    assert body["usage"]["completion_tokens"] == 8


@pytest.mark.parametrize("n", [5, 16])
async def test_more_choices_than_can_run_at_once_are_a_400(n: int) -> None:
    """n above the model's max_concurrency (4) is refused at once with a 400 naming n and
    the most it can run, before any engine work."""
    with stack(CAPPED) as gateway:
        async with aiohttp.ClientSession() as session:
            status, body = await _post(session, gateway.base_url, {"prompt": "x", "n": n})
    assert status == 400
    error = body["error"]
    assert (error["code"], error["param"]) == ("invalid_request", "n")
    assert "at most 4" in error["message"]


@pytest.mark.parametrize("lane", ["whole", "reassembled"])
async def test_every_choice_is_counted_with_the_emulator(lane: str) -> None:
    """The emulator (as vLLM) counts every choice in one usage: n = 3 of 5 tokens each is
    15 completion tokens in the answer and in the gateway's accounting, whether the unary
    request reaches the engine whole or as a stream the gateway reassembles."""
    rule = "never" if lane == "whole" else "always"
    body = CAPPED.replace("preemptible: never", f"preemptible: {rule}")
    with stack(body) as gateway:
        async with aiohttp.ClientSession() as session:
            request = {"prompt": "x", "max_tokens": 5, "ignore_eos": True, "n": 3}
            status, answer = await _post(session, gateway.base_url, request)
        counted = _completion_tokens(gateway.base_url)
    assert status == 200, answer
    assert len(answer["choices"]) == 3
    assert answer["usage"]["completion_tokens"] == 15
    assert counted == 15


def llama_like_app() -> Starlette:
    """Answers ``/v1/completions`` with ``n`` choices of ``max_tokens`` tokens as llama.cpp's
    server does (its 0.3.36 build, observed): streamed, each choice's chunks by index, and
    each choice's last chunk carries that choice's usage (its own tokens, the same
    prompt), asked for or not; unstreamed, every choice but the usage of the first one
    only."""

    async def health(_: Request) -> Response:
        return Response(b'{"status":"ok"}', media_type="application/json")

    async def metrics(_: Request) -> Response:
        return Response(b"", media_type="text/plain")

    async def completions(request: Request) -> Response:
        body = orjson.loads(await request.body())
        n, tokens = int(body.get("n", 1)), int(body["max_tokens"])
        head = {"id": "cmpl-l", "object": "text_completion", "created": 1, "model": "m",
                "system_fingerprint": "b1-llama"}  # fmt: skip

        def usage(count: int) -> dict[str, Any]:
            return {"completion_tokens": count, "prompt_tokens": 3, "total_tokens": 3 + count,
                    "prompt_tokens_details": {"cached_tokens": 0}}  # fmt: skip

        if not body.get("stream"):
            choices = [{"index": i, "text": "t " * tokens, "logprobs": None,
                        "finish_reason": "length"} for i in range(n)]  # fmt: skip
            answer = {**head, "choices": choices, "usage": usage(tokens)}
            return Response(orjson.dumps(answer), media_type="application/json")

        async def events() -> AsyncIterator[bytes]:
            for _ in range(tokens):
                for i in range(n):
                    choice = {"index": i, "text": "t ", "finish_reason": None}
                    yield b"data: " + orjson.dumps({**head, "choices": [choice]}) + b"\n\n"
            for i in range(n):
                choice = {"index": i, "text": "", "finish_reason": "length"}
                last = {**head, "choices": [choice], "usage": usage(tokens)}
                yield b"data: " + orjson.dumps(last) + b"\n\n"
            yield b"data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    return Starlette(
        routes=[
            Route("/health", health),
            Route("/metrics", metrics),
            Route("/v1/completions", completions, methods=["POST"]),
        ]
    )


@contextmanager
def llama_like_gateway() -> Iterator[Stack]:
    """A gateway whose one backend is the llama.cpp-like server above (``engine:
    llama-server``: unary requests go upstream as streams, as for the real one)."""
    with serve_in_thread(llama_like_app()) as port:
        config = parse_config(
            f"models:\n  - name: {MODEL}\n    backends:\n"
            f"      - {{name: l0, url: 'http://127.0.0.1:{port}', engine: llama-server}}\n" + CAPPED
        )
        running = start_server(build_gateway(config, environ={"SLUICEGATE_ADMIN_KEY": ADMIN_KEY}))
        try:
            yield Stack(running.port, (port,), config)
        finally:
            stop_servers([running])


@pytest.mark.parametrize("stream", [False, True], ids=["unary", "stream"])
async def test_per_choice_usage_of_llama_server_adds_up(stream: bool) -> None:
    """llama.cpp's server counts one choice per usage: n = 3 choices of 4 tokens are 12
    completion tokens in the gateway's accounting, streamed (a usage beside each choice's
    last chunk) or not (the gateway streams it upstream and rebuilds all 3 choices, usage
    summed)."""
    with llama_like_gateway() as gateway:
        request: dict[str, Any] = {"prompt": "x", "max_tokens": 4, "n": 3}
        async with aiohttp.ClientSession() as session:
            if stream:
                request.update(stream=True, stream_options={"include_usage": True})
                async with session.post(
                    gateway.base_url + "/v1/completions", json={"model": MODEL, **request}
                ) as reply:
                    status, text = reply.status, await reply.text()
                answer: dict[str, Any] = {"stream": text}
            else:
                status, answer = await _post(session, gateway.base_url, request)
        counted = _completion_tokens(gateway.base_url)
    assert status == 200, answer
    if not stream:
        assert [c["text"] for c in answer["choices"]] == ["t t t t "] * 3
        assert answer["usage"]["completion_tokens"] == 12
        assert answer["system_fingerprint"] == "b1-llama"
    assert counted == 12
