"""An engine that fails in any of the ways engines fail: the client gets a clean error, the
slot and the engine connection are freed, the circuit opens, and service recovers.

The engine is ``faulty_engine.FaultyEngine``, a real HTTP server on loopback whose
fault is switched per test. Non-streamed requests must get an OpenAI-shaped 502
or 504; streamed ones the same before the response starts, or else an
OpenAI-shaped error event followed by ``data: [DONE]``, with every event still
valid JSON. Either way nothing stays running and the failure is counted as
``upstream_error``.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import orjson
import pytest

from tests.gateway.clock_harness import clocked_gateway
from tests.gateway.gateway_harness import (
    ERROR_FIELDS,
    MODEL,
    Reply,
    Stack,
    assert_retry_headers,
    backend_state,
    gateway_at,
    http_call,
    metric,
    model_state,
    openai_error,
    outcomes,
    wait_until,
)
from tests.hardening.faulty_engine import Fault, FaultyEngine, faulty_engine

TIMEOUT_S = 0.3  # first byte, idle and connect
MARGIN_S = 1.5  # CI is a loaded 2-core machine
TIMEOUTS = (
    f"server: {{upstream_first_byte_timeout_s: {TIMEOUT_S}, upstream_idle_timeout_s:"
    f" {TIMEOUT_S}, upstream_connect_timeout_s: {TIMEOUT_S}}}\n"
)
HI = {"model": MODEL, "prompt": "hi", "max_tokens": 4}


def _sse_payloads(body: bytes) -> list[bytes]:
    """The ``data`` of each event in an SSE body, as a client's parser sees them: a line's
    field is what precedes its first colon; events end at a blank line."""
    payloads: list[bytes] = []
    data: list[bytes] = []
    for line in body.replace(b"\r\n", b"\n").split(b"\n"):
        if not line:
            if data:
                payloads.append(b"\n".join(data))
                data = []
            continue
        field, _, value = line.partition(b":")
        if field == b"data":
            data.append(value.removeprefix(b" "))
    if data:
        payloads.append(b"\n".join(data))
    return payloads


def _assert_error_event(payload: bytes, code: str | None) -> None:
    event = orjson.loads(payload)
    assert set(event) == {"error"}, event
    error = event["error"]
    assert set(error) == ERROR_FIELDS, error
    assert isinstance(error["message"], str)
    assert isinstance(error["type"], str)
    assert error["message"]
    if code is not None:
        assert error["code"] == code, error


def _assert_clean_failure(reply: Reply, status: int, code: str | None) -> None:
    """``status`` with an OpenAI error body, or (``status`` 200) a stream whose every event is
    JSON and that ends with an OpenAI error event and ``[DONE]``."""
    assert reply.status == status, reply
    if status != 200:
        error = openai_error(reply)
        if code is not None:
            assert error["code"] == code, error
        return
    assert reply.headers["content-type"].startswith("text/event-stream"), reply.headers
    payloads = _sse_payloads(reply.body)
    assert payloads[-1:] == [b"[DONE]"], payloads
    for payload in payloads[:-1]:
        try:
            assert isinstance(orjson.loads(payload), dict), payload
        except orjson.JSONDecodeError:
            raise AssertionError(f"the client got an event that is not JSON: {payload!r}") from None
    assert len(payloads) >= 2, payloads
    _assert_error_event(payloads[-2], code)


def _post(gateway: Stack, *, stream: bool) -> tuple[float, Reply]:
    start = time.monotonic()
    reply = http_call(gateway.base_url, "POST", "/v1/completions", json={**HI, "stream": stream})
    return time.monotonic() - start, reply


def _idle(gateway: Stack) -> bool:
    state = model_state(gateway.base_url)
    return (state["running"], state["queued"]) == (0, 0)


def _delta(after: dict[str, float], before: dict[str, float]) -> dict[str, float]:
    keys = set(after) | set(before)
    return {
        k: after.get(k, 0) - before.get(k, 0) for k in keys if after.get(k, 0) != before.get(k, 0)
    }


# ------------------------------------------------------------------ one failure at a time


@pytest.fixture(scope="module")
def tolerant() -> Iterator[tuple[FaultyEngine, Stack]]:
    """A faulty engine behind a gateway whose circuit never opens (each test sets the fault)."""
    with (
        faulty_engine() as engine,
        gateway_at([engine.port], "    circuit_failures: 1000\n" + TIMEOUTS, scrape=False) as gw,
    ):
        yield engine, gw


# (fault, stream, status the client gets, error code, the engine held the request open)
CASES = [
    pytest.param(Fault.ERROR_500, False, 502, "upstream_error", False, id="500-unary"),
    pytest.param(Fault.ERROR_500, True, 502, "upstream_error", False, id="500-stream"),
    pytest.param(Fault.HANG_BEFORE_HEADERS, False, 504, "upstream_timeout", True, id="hang-unary"),
    pytest.param(Fault.HANG_BEFORE_HEADERS, True, 504, "upstream_timeout", True, id="hang-stream"),
    pytest.param(Fault.HANG_MID_ANSWER, False, 504, "upstream_timeout", True, id="stall-unary"),
    pytest.param(Fault.HANG_MID_ANSWER, True, 200, "upstream_timeout", True, id="stall-stream"),
    pytest.param(Fault.TRUNCATED_STREAM, True, 200, "upstream_error", False, id="truncated"),
    pytest.param(Fault.GARBAGE_BODY, False, 502, "upstream_error", False, id="garbage-unary"),
    pytest.param(Fault.RESET, False, 502, None, False, id="reset-unary"),
    pytest.param(Fault.RESET, True, 502, None, False, id="reset-stream"),
    pytest.param(Fault.MALFORMED_STREAM, True, 200, "upstream_error", False, id="malformed"),
    pytest.param(Fault.ERROR_EVENT, True, 200, None, False, id="error-event"),
    pytest.param(Fault.CUT_MID_EVENT, True, 200, "upstream_error", False, id="cut-mid-event"),
    pytest.param(Fault.GARBAGE_BODY, True, 502, "upstream_error", False, id="not-sse"),
]  # fmt: skip


@pytest.mark.parametrize(("fault", "stream", "status", "code", "held"), CASES)
def test_engine_fault_gives_a_clean_error_and_frees_everything(
    tolerant: tuple[FaultyEngine, Stack],
    fault: Fault,
    stream: bool,
    status: int,
    code: str | None,
    held: bool,
) -> None:
    """Each fault gives the client its clean error; a hang is cut at the 0.3 s timeout and
    the engine sees its connection closed; nothing stays running or queued; the request is
    counted once, as ``upstream_error``."""
    engine, gateway = tolerant
    engine.fault = fault
    received, abandoned = engine.inference_count(), engine.abandoned
    before = outcomes(gateway.base_url)
    try:
        seconds, reply = _post(gateway, stream=stream)
    finally:
        engine.fault = Fault.NONE
    released = wait_until(lambda: engine.open == 0, 2.0)
    idle = wait_until(lambda: _idle(gateway), 1.0)
    counted = _delta(outcomes(gateway.base_url), before)
    _assert_clean_failure(reply, status, code)
    assert engine.inference_count() == received + 1
    if held:
        assert TIMEOUT_S - 0.05 <= seconds <= TIMEOUT_S + MARGIN_S, seconds
        assert engine.abandoned == abandoned + 1
    assert released
    assert idle
    assert counted == {"upstream_error": 1}


@pytest.mark.parametrize("stream", [False, True], ids=["unary", "stream"])
def test_an_engine_429_reaches_the_client_with_retry_headers(
    tolerant: tuple[FaultyEngine, Stack], stream: bool
) -> None:
    """An engine's own 429 (no Retry-After of its own) is relayed with ``Retry-After`` and
    ``retry-after-ms``, so SDKs back off; the slot is freed and no circuit failure counted."""
    engine, gateway = tolerant
    engine.fault = Fault.RATE_LIMITED
    try:
        _, reply = _post(gateway, stream=stream)
    finally:
        engine.fault = Fault.NONE
    assert reply.status == 429
    assert reply.json()["error"]["message"] == "slow down"
    assert_retry_headers(reply)
    assert wait_until(lambda: _idle(gateway), 1.0)


def test_healthy_engine_passes_through(tolerant: tuple[FaultyEngine, Stack]) -> None:
    """The faulty engine with no fault is served normally, streamed or not (the control for
    the cases above)."""
    engine, gateway = tolerant
    before = outcomes(gateway.base_url)
    _, unary = _post(gateway, stream=False)
    _, stream = _post(gateway, stream=True)
    counted = _delta(outcomes(gateway.base_url), before)
    assert unary.status == 200
    assert unary.json()["choices"][0]["text"] == "tok" * engine.chunks
    assert stream.status == 200
    assert _sse_payloads(stream.body)[-1] == b"[DONE]"
    assert counted == {"completed": 2}


# ------------------------------------------------------------------ connect timeout


@contextmanager
def blackhole(port: int = 0) -> Iterator[int]:
    """A port whose listener never accepts and whose backlog is full: a connect to it hangs
    (the SYN is dropped), as to an address that does not answer."""
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", port))
    listener.listen(0)
    port = int(listener.getsockname()[1])
    fillers = []
    try:
        for _ in range(2):
            filler = socket.socket()
            filler.setblocking(False)
            filler.connect_ex(("127.0.0.1", port))
            fillers.append(filler)
        time.sleep(0.05)
        probe = socket.socket()
        probe.settimeout(0.3)
        with probe, pytest.raises(TimeoutError):
            probe.connect(("127.0.0.1", port))  # the backlog is full, as meant
        yield port
    finally:
        for filler in fillers:
            filler.close()
        listener.close()


def test_engine_that_never_accepts_hits_the_connect_timeout() -> None:
    """A backend whose connect hangs → 504 ``upstream_timeout`` after
    ``upstream_connect_timeout_s`` (0.3 s; first-byte timeout left at 300 s), and the slot
    is freed."""
    connect_only = f"server: {{upstream_connect_timeout_s: {TIMEOUT_S}}}\n"
    with blackhole() as port, gateway_at([port], connect_only, scrape=False) as gateway:
        seconds, reply = _post(gateway, stream=False)
        idle = _idle(gateway)
        counted = outcomes(gateway.base_url)
    _assert_clean_failure(reply, 504, "upstream_timeout")
    assert TIMEOUT_S - 0.05 <= seconds <= TIMEOUT_S + MARGIN_S, seconds
    assert idle
    assert counted == {"upstream_error": 1}


# ------------------------------------------------------------------ circuit and recovery
# Cool-downs pass on the gateway's scheduling clock, which these tests advance
# (``clock_harness``); the engines, their faults and the network timeouts stay real.

FAILURES = 3
COOLDOWN_S = 30.0
STRICT = f"    circuit_failures: {FAILURES}\n    circuit_cooldown_s: {COOLDOWN_S}\n" + TIMEOUTS


@dataclass(frozen=True)
class Outage:
    """How an engine goes wrong and comes back, and what a client sees meanwhile."""

    stream: bool
    status: int
    code: str | None
    begin: Callable[[FaultyEngine], Any]
    end: Callable[[FaultyEngine], Any]


def _faulting(fault: Fault) -> Callable[[FaultyEngine], None]:
    def begin(engine: FaultyEngine) -> None:
        engine.fault = fault

    return begin


def _healed(engine: FaultyEngine) -> None:
    engine.fault = Fault.NONE


class _Blackholed:
    """Replaces a stopped engine's port with a blackhole, and back."""

    def __init__(self) -> None:
        self._hole: Any = None

    def begin(self, engine: FaultyEngine) -> None:
        engine.stop()
        self._hole = blackhole(engine.port)
        self._hole.__enter__()

    def end(self, engine: FaultyEngine) -> None:
        self._hole.__exit__(None, None, None)
        engine.start()


_hole = _Blackholed()
OUTAGES = {
    "500": Outage(False, 502, "upstream_error", _faulting(Fault.ERROR_500), _healed),
    "hang": Outage(True, 504, "upstream_timeout", _faulting(Fault.HANG_BEFORE_HEADERS), _healed),
    "stall": Outage(True, 200, "upstream_timeout", _faulting(Fault.HANG_MID_ANSWER), _healed),
    "reset": Outage(False, 502, None, _faulting(Fault.RESET), _healed),
    "connect-timeout": Outage(False, 504, "upstream_timeout", _hole.begin, _hole.end),
}


@pytest.mark.parametrize("name", list(OUTAGES))
def test_repeated_failures_open_the_circuit_and_service_recovers(name: str) -> None:
    """Three failures in a row (``circuit_failures: 3``) each get their clean error; then the
    circuit is open and the next request gets 503 ``no_healthy_backend`` at once without
    reaching the engine, and still does once the engine is well again; after the 30 s
    cool-down (on the gateway's clock), requests succeed and the circuit is closed."""
    outage = OUTAGES[name]
    with (
        faulty_engine() as engine,
        clocked_gateway([engine.port], STRICT, scrape=False) as (gateway, clock),
    ):
        outage.begin(engine)
        try:
            failures = [_post(gateway, stream=outage.stream)[1] for _ in range(FAILURES)]
            received = engine.inference_count()
            seconds, refused = _post(gateway, stream=outage.stream)
            reached = engine.inference_count() - received
            circuit = backend_state(gateway.base_url, "e0")["circuit"]
            idle = _idle(gateway)
        finally:
            outage.end(engine)
        cooling = _post(gateway, stream=False)[1].status
        clock.advance(COOLDOWN_S)
        statuses = [_post(gateway, stream=stream)[1].status for stream in (False, True) * 3]
        closed = backend_state(gateway.base_url, "e0")["circuit"]
        counted = outcomes(gateway.base_url)
    for reply in failures:
        _assert_clean_failure(reply, outage.status, outage.code)
    assert refused.status == 503
    assert openai_error(refused)["code"] == "no_healthy_backend"
    assert seconds < 1.0  # no upstream wait (reached == 0 shows none was tried)
    assert reached == 0
    assert circuit == "open"
    assert idle
    assert cooling == 503
    assert statuses == [200] * 6
    assert closed == "closed"
    assert counted.get("upstream_error") == FAILURES
    assert counted.get("completed") == 6


PROBE_S = 0.2
PROBED = (
    f"    circuit_failures: 1\n    circuit_cooldown_s: {COOLDOWN_S}\n"
    f"server: {{scrape_interval_s: {PROBE_S}}}\n"
)


def test_readiness_returns_after_the_cooldown_with_no_traffic() -> None:
    """The only engine answers 500 (its health probe still answers), so the circuit opens:
    ``/readyz`` is 503 and ``sluicegate_backend_healthy`` 0, and they stay so through two
    probe intervals after the engine heals, while the cool-down runs. Once the 30 s
    cool-down has passed on the gateway's clock, and with nothing sent, ``/readyz`` is 200
    within one probe interval (allowing 0.3 s of scheduling slack) and the gauge 1, with no
    request having moved the circuit."""
    with faulty_engine() as engine, clocked_gateway([engine.port], PROBED) as (gateway, clock):
        engine.fault = Fault.ERROR_500
        failed = _post(gateway, stream=False)[1].status
        not_ready = http_call(gateway.base_url, "GET", "/readyz").status
        down = metric(gateway.base_url, "sluicegate_backend_healthy", backend="e0")
        engine.fault = Fault.NONE
        reached = engine.inference_count()
        time.sleep(2 * PROBE_S)
        cooling = http_call(gateway.base_url, "GET", "/readyz").status
        clock.advance(COOLDOWN_S)
        advanced = time.monotonic()
        ready = wait_until(
            lambda: http_call(gateway.base_url, "GET", "/readyz").status == 200, PROBE_S + 2.0
        )
        took = time.monotonic() - advanced
        up = metric(gateway.base_url, "sluicegate_backend_healthy", backend="e0")
        sent = engine.inference_count() - reached
    assert failed == 502
    assert (not_ready, down, cooling) == (503, 0.0, 503)
    assert ready, "readiness never came back"
    assert took <= PROBE_S + 0.3
    assert up == 1.0
    assert sent == 0
