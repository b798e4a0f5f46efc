"""What the gateway answers with once an engine has answered (or could not): a whole body
relayed with its accounting, a preempted request's closing chunk, a stream's error event.
"""

from __future__ import annotations

import time

import orjson

from sluicegate.core.ticket import Feedback, Outcome, Usage
from sluicegate.engine_profiles import EngineProfile
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


_ENGINE_CODES = {400: "invalid_request", 404: "not_found", 429: "rate_limit_exceeded"}


def openai_error_body(
    profile: EngineProfile, status: int, answer: dict[str, object], body: bytes
) -> bytes:
    """An engine's error ``body`` in OpenAI's shape (string ``code``, ``param``): as it is
    when already so, else rebuilt keeping the engine's message as its profile reads it,
    with the code the profile gives for the engine's own kind of error."""
    error = answer.get("error")
    if isinstance(error, dict) and isinstance(error.get("code"), str) and "param" in error:
        return body
    read = profile.read_error(answer)
    code = profile.error_code(status, read)
    if code is None:
        code = "not_supported" if status == 501 else _ENGINE_CODES.get(status, "upstream_error")
    return error_body(status, code, read.message or f"the engine answered {status}")


def relayed_error(profile: EngineProfile, status: int, body: bytes) -> tuple[int, bytes] | None:
    """What the client gets for an engine's answer of ``status`` >= 400: (status, body in
    OpenAI's shape), or None for a 502 ``upstream_error`` (the engine's body never relayed).

    An engine 5xx or a body that is not a JSON object is a 502, except a 501 (a feature
    the engine was not started with, e.g. llama-server's embeddings) and a 500 its profile
    says is the request's own fault (``client_fault``: a 400, so no client can open a
    circuit). An engine 4xx keeps its status and message, unless its profile says it is
    the engine's own failure (``engine_fault``: a 502). An answer the profile reads as
    ``busy`` (Ray Serve's backpressure 503) is an engine 429 with the engine's text.
    """
    if profile.busy(status, body):
        message = body.decode(errors="replace").strip() or "the engine is full"
        return 429, error_body(429, _ENGINE_CODES[429], message)
    try:
        answer = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(answer, dict):
        return None
    read = profile.read_error(answer)
    if status == 500 and profile.client_fault(status, read):
        status = 400
    if (status >= 500 and status != 501) or profile.engine_fault(status, read):
        return None
    return status, openai_error_body(profile, status, answer, body)


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
    exchange: Exchange,
    profile: EngineProfile,
    status: int,
    body: bytes,
    *,
    ttft_s: float | None = None,
) -> None:
    """Answer with the engine's whole body, and end the exchange by it; ``ttft_s`` (from
    admission) if the engine streamed it; ``profile``: the engine's, which reads its errors.

    An error answer is relayed as ``relayed_error`` says (or is a 502). For the adaptive
    limit a success is a latency sample, the engine's 429 a drop (like its 5xx, which
    also count against the circuit), any other 4xx (and 501) nothing.
    """
    fail = GatewayError(502, "upstream_error", f"the engine answered {status}")
    if status >= 400:
        relayed = relayed_error(profile, status, body)
        if relayed is None:
            raise exchange.fail(fail)
        status, body = relayed
        answer: dict[str, object] = {}  # an error counts the estimate, no output
    else:
        try:
            parsed = orjson.loads(body)
        except orjson.JSONDecodeError:
            parsed = None
        if not isinstance(parsed, dict):
            raise exchange.fail(fail)
        answer = parsed
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
