"""What the gateway answers with once an engine has answered (or could not): a whole body
relayed with its accounting, a preempted request's closing chunk, a stream's error event.
"""

from __future__ import annotations

import time

import orjson

from sluicegate.core.ticket import Feedback, Outcome, Usage
from sluicegate.gateway.http_errors import GatewayError, error_body
from sluicegate.gateway.request.exchange import Exchange
from sluicegate.gateway.streams.endpoint_kind import Endpoint

ENGINE_RETRY_AFTER_S = 1.0


def preempted_chunk(endpoint: Endpoint, request_id: str) -> bytes:
    """The last event of a preempted stream (``finish_reason: "preempted"``), then ``[DONE]``."""
    if endpoint == "chat":
        choice: dict[str, object] = {"index": 0, "delta": {}, "finish_reason": "preempted"}
        kind = "chat.completion.chunk"
    else:
        choice = {"index": 0, "text": "", "finish_reason": "preempted"}
        kind = "text_completion"
    event = {"id": request_id, "object": kind, "created": int(time.time()), "choices": [choice]}
    return b"data: " + orjson.dumps(event) + b"\n\ndata: [DONE]\n\n"


def error_event(code: str, message: str) -> bytes:
    """An OpenAI-shaped error event, then ``[DONE]``: how a started stream ends badly."""
    body = {"error": {"message": message, "type": "api_error", "code": code, "param": None}}
    return b"data: " + orjson.dumps(body) + b"\n\ndata: [DONE]\n\n"


CLIENT_FAULT_500 = (
    "image input is not supported",
    "audio input is not supported",
    "Failed to parse messages",
)
"""How llama-server's 500s for the request's own fault begin (a part it was not started
to read, a message it cannot parse): answered as 400s, so no client can open a circuit."""
_ENGINE_CODES = {400: "invalid_request", 404: "not_found", 429: "rate_limit_exceeded"}


def _engine_message(answer: dict[str, object]) -> tuple[str | None, object]:
    """The message and ``type`` of an engine's error body (OpenAI's, llama-server's or
    vLLM's shape, whose message is at the top level)."""
    error = answer.get("error")
    if isinstance(error, dict):
        message = error.get("message")
        return (message if isinstance(message, str) else None), error.get("type")
    message = answer.get("message")
    return (message if isinstance(message, str) else None), answer.get("type")


def openai_error_body(status: int, answer: dict[str, object], body: bytes) -> bytes:
    """An engine's error ``body`` in OpenAI's shape (string ``code``, ``param``): as it is
    when already so, else rebuilt keeping the engine's message. llama-server's context
    overflow becomes ``context_length_exceeded``."""
    error = answer.get("error")
    if isinstance(error, dict) and isinstance(error.get("code"), str) and "param" in error:
        return body
    message, kind = _engine_message(answer)
    if kind == "exceed_context_size_error":
        code = "context_length_exceeded"
    elif status == 501:
        code = "not_supported"
    else:
        code = _ENGINE_CODES.get(status, "upstream_error")
    return error_body(status, code, message or f"the engine answered {status}")


def _reported_usage(answer: dict[str, object], prompt: int) -> tuple[int, int]:
    """(prompt, completion) tokens from an answer's ``usage``; the estimate and 0 for
    anything missing or not a non-negative integer."""
    completion = 0
    usage = answer.get("usage")
    if isinstance(usage, dict):
        reported = usage.get("prompt_tokens")
        if type(reported) is int and reported >= 0:
            prompt = reported
        reported = usage.get("completion_tokens")
        if type(reported) is int and reported >= 0:
            completion = reported
    return prompt, completion


async def relay_answer(
    exchange: Exchange, status: int, body: bytes, *, ttft_s: float | None = None
) -> None:
    """Answer with the engine's whole body, and end the exchange by it; ``ttft_s`` (from
    admission) if the engine streamed it.

    An engine 5xx or a body that is not a JSON object is a 502 ``upstream_error``
    (the engine's body is never relayed), except a 501 (a feature the engine was not
    started with, e.g. llama-server's embeddings) and a 500 that llama-server gives
    for the request's own fault (``CLIENT_FAULT_500``: a 400). An engine 4xx keeps
    its status and message in OpenAI's error shape. For the adaptive limit a success
    is a latency sample, the engine's 429 a drop (like its 5xx, which also count
    against the circuit), any other 4xx (and 501) nothing.
    """
    try:
        answer = orjson.loads(body)
    except orjson.JSONDecodeError:
        answer = None
    if status == 500 and isinstance(answer, dict):
        message, _ = _engine_message(answer)
        if message is not None and message.startswith(CLIENT_FAULT_500):
            status = 400
    if (status >= 500 and status != 501) or not isinstance(answer, dict):
        raise exchange.fail(GatewayError(502, "upstream_error", f"the engine answered {status}"))
    if status >= 400:
        body = openai_error_body(status, answer, body)
    prompt, completion = _reported_usage(answer, exchange.ticket.prompt_tokens)
    if status < 400:
        outcome, feedback = Outcome.COMPLETED, Feedback.SAMPLE
    else:
        outcome = Outcome.UPSTREAM_ERROR
        feedback = Feedback.DROP if status == 429 else Feedback.IGNORE
    usage = Usage(prompt, completion, ttft_s=ttft_s, feedback=feedback)
    exchange.finish(outcome, usage, ttft_s=exchange.since_arrival())
    # The engine's own 429 (its headers are not relayed) still says when to retry.
    retry_after_s = ENGINE_RETRY_AFTER_S if status == 429 else None
    await exchange.reply(status, body, retry_after_s=retry_after_s)
