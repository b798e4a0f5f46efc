"""The waiting room (``wait_for_backends: true``): while no backend of a model is healthy,
its requests queue instead of being refused, so an engine can scale from zero.

Real gateway, real emulated engine started on a port the gateway already names; the
active probe (``server.scrape_interval_s``) is what notices the engine coming up.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

from tests.gateway.gateway_harness import (
    FAST_PRIORS,
    MODEL,
    EngineServer,
    Reply,
    assert_retry_headers,
    gateway_at,
    http_call,
    model_state,
    openai_error,
    outcomes,
    unused_port,
    wait_until,
)

INTERVAL_S = 0.2
QUEUE_TIMEOUT_S = 1.0
SMALL = {"model": MODEL, "prompt": "wake up", "max_tokens": 3, "ignore_eos": True}


def _body(wait: bool, queue_timeout_s: float = 5.0) -> str:
    return f"""    max_concurrency: 4
    wait_for_backends: {str(wait).lower()}
    lanes:
      - {{name: interactive, max_concurrency: 4, queue_timeout_s: {queue_timeout_s}}}
{FAST_PRIORS}server: {{scrape_interval_s: {INTERVAL_S}}}
"""


@dataclass
class _Call:
    """A completion sent from a thread: its reply and when it arrived (monotonic)."""

    reply: Reply | None = None
    answered_at: float = 0.0
    thread: threading.Thread = field(default_factory=threading.Thread)


def _send_in_background(base_url: str) -> _Call:
    call = _Call()

    def run() -> None:
        call.reply = http_call(base_url, "POST", "/v1/completions", json=SMALL, timeout=20)
        call.answered_at = time.monotonic()

    call.thread = threading.Thread(target=run, daemon=True)
    call.thread.start()
    return call


def _readyz(base_url: str) -> Reply:
    return http_call(base_url, "GET", "/readyz")


def test_a_queued_request_completes_once_the_engine_comes_up() -> None:
    """With no engine listening, ``/readyz`` answers 200 ``waiting_for_backends`` and a
    request queues (not refused); an engine started on the backend's port is found by the
    next probe and the request completes 200 within one scrape interval (+0.5 s slack);
    ``/readyz`` then says ``ready``."""
    port = unused_port()
    engine = EngineServer()
    engine.port = port
    with gateway_at([port], _body(True)) as gateway:
        assert wait_until(lambda: not model_state(gateway.base_url)["backends"][0]["healthy"], 3)
        ready = _readyz(gateway.base_url)
        assert (ready.status, ready.json()) == (200, {"status": "waiting_for_backends"})

        call = _send_in_background(gateway.base_url)
        assert wait_until(lambda: model_state(gateway.base_url)["queued"] == 1, 3)
        time.sleep(3 * INTERVAL_S)  # several probes fail while it waits
        assert call.reply is None
        assert model_state(gateway.base_url)["queued"] == 1

        try:
            engine.start()
            up_at = time.monotonic()
            call.thread.join(10)
            assert call.reply is not None
            assert call.reply.status == 200, call.reply
            assert call.reply.json()["usage"]["completion_tokens"] == 3
            assert call.answered_at - up_at < INTERVAL_S + 0.5
            ready = _readyz(gateway.base_url)
            assert (ready.status, ready.json()) == (200, {"status": "ready"})
            assert outcomes(gateway.base_url) == {"completed": 1.0}
        finally:
            engine.stop()


def test_without_the_flag_no_healthy_backend_is_refused_at_once() -> None:
    """Without ``wait_for_backends`` the same gateway refuses at once (well under the lane's
    queue timeout) with 503 ``no_healthy_backend`` and Retry-After; ``/readyz`` is 503."""
    with gateway_at([unused_port()], _body(False)) as gateway:
        assert wait_until(lambda: not model_state(gateway.base_url)["backends"][0]["healthy"], 3)
        started = time.monotonic()
        reply = http_call(gateway.base_url, "POST", "/v1/completions", json=SMALL)
        assert time.monotonic() - started < 0.5
        assert reply.status == 503
        assert openai_error(reply)["code"] == "no_healthy_backend"
        assert_retry_headers(reply)
        ready = _readyz(gateway.base_url)
        assert (ready.status, ready.json()) == (503, {"status": "no_healthy_backend"})
        assert outcomes(gateway.base_url) == {"rejected_unavailable": 1.0}


def test_with_the_flag_and_no_engine_the_request_times_out_in_the_queue() -> None:
    """With ``wait_for_backends`` and no engine ever, a request waits the lane's
    ``queue_timeout_s`` (not much longer) and gets 503 ``queue_timeout`` with Retry-After
    and retry-after-ms; the advised wait is at least a second, since nothing can serve
    it sooner than a probe finds an engine (an immediate retry would only queue again)."""
    with gateway_at([unused_port()], _body(True, QUEUE_TIMEOUT_S)) as gateway:
        assert wait_until(lambda: not model_state(gateway.base_url)["backends"][0]["healthy"], 3)
        started = time.monotonic()
        reply = http_call(gateway.base_url, "POST", "/v1/completions", json=SMALL)
        waited = time.monotonic() - started
        assert QUEUE_TIMEOUT_S - 0.05 <= waited < QUEUE_TIMEOUT_S + 0.5, waited
        assert reply.status == 503
        assert openai_error(reply)["code"] == "queue_timeout"
        assert_retry_headers(reply)
        assert int(reply.headers["retry-after-ms"]) >= 1000, reply.headers
        assert outcomes(gateway.base_url) == {"expired": 1.0}
        assert model_state(gateway.base_url)["queued"] == 0


def test_a_request_sent_before_the_first_probe_waits_rather_than_failing() -> None:
    """Until a probe has answered, a waiting-room model's backend is not known to be up: a
    request is held (then times out in the queue), never forwarded to the dead port (a
    502 ``upstream_unavailable``). Probes are off here (``scrape=False``), so this is
    the state right after start-up, before the first probe, made to last."""
    with gateway_at([unused_port()], _body(True, QUEUE_TIMEOUT_S), scrape=False) as gateway:
        reply = http_call(gateway.base_url, "POST", "/v1/completions", json=SMALL)
        assert reply.status == 503, reply
        assert openai_error(reply)["code"] == "queue_timeout"
        assert outcomes(gateway.base_url) == {"expired": 1.0}
