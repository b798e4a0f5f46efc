"""Small clients for the real-engine tests: ask the engine itself, read raw streams."""

from __future__ import annotations

import socket
import time

import openai
import orjson

from tests.gateway.gateway_harness import MODEL, Reply, http_call
from tests.realengine.engine_process import answers_200


def sdk_client(base_url: str) -> openai.OpenAI:
    """The official SDK, pointed at ``base_url`` (a gateway or an engine), without retries."""
    return openai.OpenAI(base_url=base_url + "/v1", api_key="unused", max_retries=0)


def token_count(engine_url: str, text: str) -> int:
    """The engine's own token count of ``text`` (``POST /extras/tokenize/count``)."""
    reply = http_call(engine_url, "POST", "/extras/tokenize/count", json={"input": text})
    assert reply.status == 200, reply
    count: int = reply.json()["count"]
    return count


def engine_answers_within(engine_url: str, seconds: float) -> bool:
    """Whether the engine serves ``GET /v1/models`` within ``seconds``.

    llama-cpp-python serves that endpoint under the same lock as generation, so
    it answers only once no request is being generated.
    """
    return answers_200(engine_url + "/v1/models", seconds)


def wait_engine_idle(engine_url: str, within_s: float) -> float | None:
    """Seconds until the engine is idle (see ``engine_answers_within``); None if not in time."""
    start = time.monotonic()
    if engine_answers_within(engine_url, within_s):
        return time.monotonic() - start
    return None


def completion_body(prompt: str, max_tokens: int, *, stream: bool = False) -> dict[str, object]:
    """A greedy (temperature 0) completion request for the tiny model."""
    return {
        "model": MODEL, "prompt": prompt, "max_tokens": max_tokens,
        "temperature": 0.0, "stream": stream,
    }  # fmt: skip


def post_broken_json(base_url: str) -> Reply:
    """``POST /v1/completions`` of a body that is not JSON (``{"model":``), sent as JSON."""
    return http_call(
        base_url, "POST", "/v1/completions", body=b'{"model":',
        headers={"Content-Type": "application/json"},
    )  # fmt: skip


def data_payloads(body: bytes) -> list[bytes]:
    """The ``data:`` payloads of a whole SSE body, in order."""
    return [line[5:].strip() for line in body.split(b"\n") if line.startswith(b"data:")]


def error_of(payloads: list[bytes]) -> dict[str, object] | None:
    """The ``error`` object of the first error event among ``payloads`` (None if none)."""
    for payload in payloads:
        if payload == b"[DONE]":
            continue
        event = orjson.loads(payload)
        if isinstance(event, dict) and isinstance(event.get("error"), dict):
            error: dict[str, object] = event["error"]
            return error
    return None


# Every token of the tiny vocabulary (262) as a top logprob: ~4 KB a streamed chunk, so a long
# answer is megabytes, more than the socket buffers between a client and the engine hold.
ALL_LOGPROBS = 262


def stalled_stream(port: int, max_tokens: int = 3000) -> socket.socket:
    """A raw client that sends a long streamed completion with big chunks, then reads
    nothing and does not close (the caller closes the returned socket)."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", port))
    body = orjson.dumps(
        {**completion_body("stall", max_tokens, stream=True), "logprobs": ALL_LOGPROBS}
    )
    head = (
        "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    sock.sendall(head.encode() + body)
    return sock
