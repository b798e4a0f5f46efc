"""The gateway owns its mistakes (issue 27): a bug in the gateway is a 500 that blames no
engine.

One internal function of the in-process gateway is patched to raise (patching internals
is allowed to plant a bug). The client gets a 500 ``internal_error`` in OpenAI's shape (a
started stream is cut), the ticket ends once as ``internal_error``, the backend's circuit
(``circuit_failures: 1``) and the adaptive limit (``aimd``, which an engine failure
lowers) are untouched, the failure is logged once with the request id and a traceback
and without the request's content, and the next request is served. The engine is the
emulator on loopback. Refused connections: ``test_gateway_owns_mistakes.py``.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Callable
from typing import Any

import aiohttp
import pytest

from sluicegate.gateway.request import relay_unary, serving
from sluicegate.gateway.streams.scanner import SseScanner
from tests.gateway.gateway_harness import (
    FAST_PRIORS,
    MODEL,
    Stack,
    backend_state,
    engine_server,
    gateway_at,
    http_call,
    metric,
    model_state,
    openai_error,
    outcomes,
    read_events,
)

SMALL = {"model": MODEL, "prompt": "owned", "max_tokens": 4}
SECRET_PROMPT = "canary-prompt-7f3c: nobody logs me"

STRICT = f"""    max_concurrency: 8
    circuit_failures: 1
    circuit_cooldown_s: 60
    adaptive: {{mode: aimd, floor: 1}}
{FAST_PRIORS}"""


def _health(gateway: Stack) -> tuple[str, bool, float, float | None]:
    """The backend's circuit and health, the effective cap, and the limit metric."""
    backend = backend_state(gateway.base_url, "e0")
    cap = float(model_state(gateway.base_url)["cap"])
    limit = metric(gateway.base_url, "sluicegate_concurrency_limit", model=MODEL)
    return backend["circuit"], backend["healthy"], cap, limit


def _bug_logged(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    """The gateway's error records, after checking none carries the request's content."""
    assert SECRET_PROMPT not in caplog.text
    return [
        r for r in caplog.records if r.name == "sluicegate.gateway" and r.levelno >= logging.ERROR
    ]


def _once(original: Callable[..., Any]) -> Callable[..., Any]:
    """``original``, except that its first call raises: a planted bug."""
    calls = []

    def planted(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("planted bug")
        return original(*args, **kwargs)

    return planted


def test_a_bug_after_the_answer_is_a_500_that_blames_no_engine(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A bug between the engine's answer and the client (``relay_answer`` raises): 500
    ``internal_error`` in OpenAI's shape; with ``circuit_failures: 1`` and an ``aimd``
    limit, the circuit stays closed and the limit where it was; counted once as
    ``internal_error``; logged once with the request id and a traceback, without the
    prompt; the next request is served."""
    caplog.set_level(logging.INFO)
    monkeypatch.setattr(relay_unary, "relay_answer", _once(relay_unary.relay_answer))
    body = {**SMALL, "prompt": SECRET_PROMPT}
    with engine_server() as engine, gateway_at([engine.port], STRICT) as gateway:
        before = _health(gateway)
        reply = http_call(gateway.base_url, "POST", "/v1/completions", json=body)
        after = _health(gateway)
        counted = outcomes(gateway.base_url)
        running = model_state(gateway.base_url)["running"]
        following = http_call(gateway.base_url, "POST", "/v1/completions", json=body)
    assert reply.status == 500, reply
    error = openai_error(reply)
    assert (error["code"], error["type"]) == ("internal_error", "api_error")
    assert SECRET_PROMPT not in reply.body.decode()
    assert before[:2] == ("closed", True)
    assert after == before
    assert counted == {"internal_error": 1.0}
    assert running == 0
    assert following.status == 200
    (record,) = _bug_logged(caplog)
    assert record.exc_info is not None
    assert re.search(r"request [0-9a-f]{32}\b", record.getMessage()), record.getMessage()


async def test_a_bug_mid_stream_cuts_the_stream_and_blames_no_engine(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A bug while relaying a started stream (the event scanner raises at its third read):
    the client's stream is cut (no ``[DONE]``), the ticket ends once as
    ``internal_error``, the circuit and the limit are untouched, the slot is free, and the
    next stream completes."""
    caplog.set_level(logging.INFO)
    original = SseScanner.scan_all
    calls: list[int] = []

    def planted(self: SseScanner, payloads: list[bytes]) -> bool:
        calls.append(1)
        if len(calls) == 3:
            raise RuntimeError("planted bug")
        return original(self, payloads)

    monkeypatch.setattr(SseScanner, "scan_all", planted)
    body = {**SMALL, "prompt": SECRET_PROMPT, "max_tokens": 64, "stream": True}
    with engine_server() as engine, gateway_at([engine.port], STRICT) as gateway:
        before = await asyncio.to_thread(_health, gateway)
        async with aiohttp.ClientSession() as session:
            url = gateway.base_url + "/v1/completions"
            async with session.post(url, json=body) as response:
                status = response.status
                try:
                    events = await read_events(response)
                except aiohttp.ClientPayloadError:
                    events = []
            async with session.post(url, json=body) as response:
                following = await read_events(response)
        after = await asyncio.to_thread(_health, gateway)
        counted = await asyncio.to_thread(outcomes, gateway.base_url)
        running = (await asyncio.to_thread(model_state, gateway.base_url))["running"]
    assert status == 200
    assert b"[DONE]" not in events
    assert before[:2] == ("closed", True)
    assert after == before
    assert following[-1:] == [b"[DONE]"]
    assert counted == {"internal_error": 1.0, "completed": 1.0}
    assert running == 0
    assert len(_bug_logged(caplog)) == 1


def test_a_bug_before_the_ticket_is_a_500_in_openai_shape(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A bug while the request is being classified (before it has a ticket): 500
    ``internal_error`` in OpenAI's shape, not the server's plain-text 500; nothing is
    counted or held, and the next request is served."""
    caplog.set_level(logging.INFO)
    monkeypatch.setattr(serving, "estimate_prompt_tokens", _once(serving.estimate_prompt_tokens))
    body = {**SMALL, "prompt": SECRET_PROMPT}
    with engine_server() as engine, gateway_at([engine.port], STRICT) as gateway:
        reply = http_call(gateway.base_url, "POST", "/v1/completions", json=body)
        counted = outcomes(gateway.base_url)
        following = http_call(gateway.base_url, "POST", "/v1/completions", json=body)
    assert reply.status == 500, reply
    assert openai_error(reply)["code"] == "internal_error"
    assert counted == {}
    assert following.status == 200
    assert len(_bug_logged(caplog)) == 1


def test_a_path_that_forgets_to_end_its_ticket_is_a_500_that_blames_no_engine(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A relay that returns without answering or ending its ticket (a bug): the handler
    ends it as ``internal_error`` (slot freed, circuit closed) and answers 500
    ``internal_error``, logging that the ticket was not ended."""
    caplog.set_level(logging.INFO)

    async def forgetful(self: relay_unary.UnaryRelay, exchange: Any) -> None:
        return None

    monkeypatch.setattr(relay_unary.UnaryRelay, "serve", forgetful)
    with engine_server() as engine, gateway_at([engine.port], STRICT) as gateway:
        before = _health(gateway)
        reply = http_call(gateway.base_url, "POST", "/v1/completions", json=SMALL)
        after = _health(gateway)
        counted = outcomes(gateway.base_url)
        running = model_state(gateway.base_url)["running"]
    assert reply.status == 500, reply
    assert openai_error(reply)["code"] == "internal_error"
    assert after == before
    assert counted == {"internal_error": 1.0}
    assert running == 0
    (record,) = _bug_logged(caplog)
    assert "without ending its ticket" in record.getMessage()
