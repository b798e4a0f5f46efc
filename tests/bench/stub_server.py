"""A tiny OpenAI-like stub server on loopback for the load generator's tests.

It is the *load generator* that is under test: the stub streams ``max_tokens`` chat or
completions chunks with a small delay, sets ``X-Sluicegate-Queue-Ms``, answers 429 with
``Retry-After`` for the key ``key-limited``, and can sleep before answering or split
every SSE event across several TCP writes.
"""

from __future__ import annotations

import asyncio
import itertools
from dataclasses import dataclass, field

import orjson
from aiohttp import web

LIMITED_KEY = "key-limited"
QUEUE_MS = "12.5"


@dataclass
class StubConfig:
    """What the stub does; tests mutate it before a run."""

    chunk_delay_s: float = 0.002
    delay_before_s: float = 0.0
    split_events: bool = False
    usage: bool = True


@dataclass
class Stub:
    """A running stub: its base URL, behaviour, and every request it received."""

    url: str
    config: StubConfig
    received: list[tuple[dict[str, str], dict[str, object]]] = field(default_factory=list)


def _chunk(body: dict[str, object], index: int, last: bool) -> dict[str, object]:
    finish = "length" if last else None
    if "messages" in body:
        choice: dict[str, object] = {"index": 0, "delta": {"content": f"t{index} "}}
    else:
        choice = {"index": 0, "text": f"t{index} "}
    choice["finish_reason"] = finish
    return {"id": "x", "object": "chunk", "choices": [choice]}


async def _write_event(resp: web.StreamResponse, payload: bytes, split: bool) -> None:
    event = b"data: " + payload + b"\n\n"
    if not split:
        await resp.write(event)
        return
    # cut inside the "data:" prefix, inside the JSON and between the two newlines
    cuts = [0, 3, 3 + len(payload) // 2, len(event) - 1, len(event)]
    for start, end in itertools.pairwise(cuts):
        await resp.write(event[start:end])
        await asyncio.sleep(0.003)


async def _stream(
    request: web.Request, body: dict[str, object], config: StubConfig
) -> web.StreamResponse:
    resp = web.StreamResponse(
        headers={"Content-Type": "text/event-stream", "X-Sluicegate-Queue-Ms": QUEUE_MS}
    )
    await resp.prepare(request)
    tokens = int(str(body["max_tokens"]))
    for index in range(tokens):
        await asyncio.sleep(config.chunk_delay_s)
        chunk = orjson.dumps(_chunk(body, index, index == tokens - 1))
        await _write_event(resp, chunk, config.split_events)
    if config.usage:
        usage = {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": tokens}}
        await _write_event(resp, orjson.dumps(usage), config.split_events)
    await _write_event(resp, b"[DONE]", config.split_events)
    await resp.write_eof()
    return resp


def _app(stub: Stub) -> web.Application:
    async def handle(request: web.Request) -> web.StreamResponse:
        body = orjson.loads(await request.read())
        stub.received.append((dict(request.headers), body))
        if request.headers.get("Authorization") == f"Bearer {LIMITED_KEY}":
            error = {
                "error": {
                    "message": "slow down",
                    "type": "rate_limit",
                    "code": "rate_limit_exceeded",
                }
            }
            return web.json_response(error, status=429, headers={"Retry-After": "2"})
        await asyncio.sleep(stub.config.delay_before_s)
        if body.get("stream"):
            return await _stream(request, body, stub.config)
        tokens = int(str(body["max_tokens"]))
        choice = {"index": 0, "message": {"content": "x" * tokens}, "finish_reason": "length"}
        usage = {"prompt_tokens": 3, "completion_tokens": tokens}
        answer = {"choices": [choice], "usage": usage}
        return web.json_response(answer, headers={"X-Sluicegate-Queue-Ms": QUEUE_MS})

    app = web.Application()
    app.router.add_post("/v1/chat/completions", handle)
    app.router.add_post("/v1/completions", handle)
    return app


async def start_stub() -> tuple[Stub, web.AppRunner]:
    """Start a stub on an ephemeral loopback port; the caller cleans the runner up."""
    server = Stub(url="", config=StubConfig())
    runner = web.AppRunner(_app(server), handler_cancellation=True)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    host, port = runner.addresses[0][:2]
    server.url = f"http://{host}:{port}"
    return server, runner
