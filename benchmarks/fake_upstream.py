"""The smallest OpenAI-compatible upstream: fixed answers, so a proxy's cost dominates.

``POST /v1/chat/completions`` (and ``/v1/completions``) answers one small, fixed
``chat.completion`` JSON, or, when the body asks for ``"stream": true``, a short
fixed SSE stream (a role chunk with the first token, a second token, the finish
chunk, a usage chunk, ``[DONE]``); the body is otherwise not parsed, only searched
for the stream flag. ``GET /health`` says ok; ``GET /metrics`` gives the vLLM
gauges the gateway's scraper reads (``vllm:num_requests_running`` counts the
streams in progress; the queue and KV cache are always empty). Runs on uvloop
when it is installed.

    python benchmarks/fake_upstream.py --port 8000 [--model NAME]
"""

from __future__ import annotations

import argparse
import re
import sys

import orjson
from aiohttp import web

from livestack import fast_loop

STREAM_FLAG = re.compile(rb'"stream"\s*:\s*true')
USAGE = {"prompt_tokens": 16, "completion_tokens": 2, "total_tokens": 18}


def answers(model: str) -> tuple[bytes, list[bytes]]:
    """The pre-encoded JSON answer and SSE events every request gets."""
    head = {"id": "chatcmpl-floor", "created": 1_700_000_000, "model": model}
    message = {"role": "assistant", "content": "Hello there"}
    whole = {
        **head,
        "object": "chat.completion",
        "choices": [{"index": 0, "message": message, "logprobs": None, "finish_reason": "length"}],
        "usage": USAGE,
    }
    chunk = {**head, "object": "chat.completion.chunk"}
    deltas: list[tuple[dict[str, str], str | None]] = [
        ({"role": "assistant", "content": "Hello"}, None),
        ({"content": " there"}, None),
        ({}, "length"),
    ]
    events = [
        {**chunk, "choices": [{"index": 0, "delta": d, "logprobs": None, "finish_reason": f}]}
        for d, f in deltas
    ]
    events.append({**chunk, "choices": [], "usage": USAGE})
    encoded = [b"data: " + orjson.dumps(event) + b"\n\n" for event in events]
    return orjson.dumps(whole), [*encoded, b"data: [DONE]\n\n"]


def build_upstream(model: str) -> web.Application:
    """The aiohttp app answering completions, ``/health`` and ``/metrics``."""
    whole, events = answers(model)
    running = [0]
    labels = f'{{model_name="{model}",engine="0"}}'

    async def complete(request: web.Request) -> web.StreamResponse:
        body = await request.read()
        if not STREAM_FLAG.search(body):
            return web.Response(body=whole, content_type="application/json")
        running[0] += 1
        try:
            response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await response.prepare(request)
            for event in events:
                await response.write(event)
            await response.write_eof()
            return response
        finally:
            running[0] -= 1

    async def health(request: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def metrics(request: web.Request) -> web.Response:
        text = (
            f"# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{labels} "
            f"{running[0]}\n# TYPE vllm:num_requests_waiting gauge\n"
            f"vllm:num_requests_waiting{labels} 0\n# TYPE vllm:kv_cache_usage_perc gauge\n"
            f"vllm:kv_cache_usage_perc{labels} 0.0\n"
        )
        return web.Response(text=text, content_type="text/plain")

    app = web.Application()
    app.router.add_post("/v1/chat/completions", complete)
    app.router.add_post("/v1/completions", complete)
    app.router.add_get("/health", health)
    app.router.add_get("/metrics", metrics)
    return app


def command(port: int, model: str) -> list[str]:
    """The command line that serves this upstream on ``port`` (``Children.run`` runs it)."""
    return [sys.executable, __file__, "--port", str(port), "--model", model]


def main() -> None:
    """Serve until SIGTERM or Ctrl-C."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--model", default="floor-llm")
    args = parser.parse_args()
    app = build_upstream(args.model)
    web.run_app(app, host=args.host, port=args.port, print=None, access_log=None, loop=fast_loop())


if __name__ == "__main__":
    main()
