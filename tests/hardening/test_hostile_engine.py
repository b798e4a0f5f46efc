"""A hostile or broken engine cannot exhaust the gateway's memory or stall its event loop,
and pooled connections stay clean or are closed.

The gateway is a real ``sluicegate serve`` process (so its resident memory can be read),
in front of ``hostile_engine.HostileEngine``, a raw asyncio server on loopback whose
answer mode each test switches. For every mode: the gateway's peak RSS grows by less
than 64 MiB, ``/healthz`` (asked every 5 ms from another thread) keeps a p99 under
100 ms while the hostile answer arrives, the request ends with the documented error
within its timeouts, and the next request to the same backend gets its own answer.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest

from tests.gateway.gateway_harness import Reply, http_call, openai_error
from tests.hardening.gateway_process import GatewayProcess, gateway_process, probing
from tests.hardening.hostile_engine import UNSOLICITED_TEXT, HostileEngine, Mode, hostile_engine

TIMEOUT_S = 1.0  # first byte and idle
MARGIN_S = 2.0  # a loaded 2-core machine
BODY_CAP = 4 * 1024 * 1024
MAX_GROWTH = 64 * 1024 * 1024
MAX_P99_S = 0.1
PROBE_S = 0.3  # /healthz is asked at least this long around each hostile answer
REASSEMBLED = "tiny-r"  # a llama-server backend: non-streamed requests go as streams
SERVER = (
    f"upstream_first_byte_timeout_s: {TIMEOUT_S}, upstream_idle_timeout_s: {TIMEOUT_S},"
    f" max_upstream_body_bytes: {BODY_CAP}"
)


@pytest.fixture(scope="module")
def stack(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[HostileEngine, GatewayProcess]]:
    """The hostile engine (healthy until a test says otherwise) behind a gateway process
    whose circuit never opens, with a plain (``tiny``) and a reassembling model."""
    log_dir: Path = tmp_path_factory.mktemp("hostile")
    with (
        hostile_engine(budget_s=30.0) as engine,
        gateway_process(
            engine.url,
            log_dir,
            server=SERVER,
            model="circuit_failures: 1000",
            models=(("tiny", "vllm"), (REASSEMBLED, "llama-server")),
        ) as gateway,
    ):
        for model in ("tiny", REASSEMBLED):
            _assert_own_answer(gateway, model, "warm-up")
        yield engine, gateway


def _complete(
    gateway: GatewayProcess, prompt: str, *, model: str = "tiny", stream: bool = False
) -> Reply:
    body = {"model": model, "prompt": prompt, "max_tokens": 4, "stream": stream}
    return http_call(gateway.url, "POST", "/v1/completions", json=body, timeout=15)


def _assert_own_answer(gateway: GatewayProcess, model: str, prompt: str) -> None:
    reply = _complete(gateway, prompt, model=model)
    assert reply.status == 200, (reply, gateway.log())
    assert reply.json()["choices"][0]["text"] == prompt, reply


def _stream_error(reply: Reply) -> dict[str, object]:
    """The error event that ends a started stream (before ``[DONE]``)."""
    assert reply.status == 200, reply
    events = [e for e in reply.body.split(b"\n\n") if e.startswith(b"data: ")]
    assert events[-1] == b"data: [DONE]", events[-2:]
    error = orjson.loads(events[-2][6:])["error"]
    assert isinstance(error, dict), error
    return error


BODY, HEAD, PROTOCOL = (
    "upstream_body_too_large",
    "upstream_head_too_large",
    "upstream_protocol_error",
)
EVENT = "upstream_event_too_large"
R = REASSEMBLED
# (mode, model, streamed, status the client gets, code)
CASES = [
    pytest.param(Mode.ENDLESS_CHUNKED, "tiny", False, 502, BODY, id="endless-chunked"),
    pytest.param(Mode.ENDLESS_LENGTH, "tiny", False, 502, BODY, id="endless-length"),
    pytest.param(Mode.ENDLESS_HEADERS, "tiny", False, 502, HEAD, id="endless-headers"),
    pytest.param(Mode.HUGE_HEADER_VALUE, "tiny", False, 502, HEAD, id="huge-header-value"),
    pytest.param(Mode.INTERIM_FLOOD, "tiny", False, 502, HEAD, id="1xx-flood"),
    pytest.param(Mode.SWITCHING_PROTOCOLS, "tiny", False, 502, PROTOCOL, id="101"),
    pytest.param(Mode.BAD_CHUNK_SIZE, "tiny", False, 502, PROTOCOL, id="bad-chunk-size"),
    pytest.param(Mode.CLOSE_MID_BODY, "tiny", False, 502, "upstream_error", id="close-mid-body"),
    pytest.param(Mode.SLOW_HEAD, "tiny", False, 504, "upstream_timeout", id="slow-head"),
    pytest.param(Mode.ENDLESS_EVENT, "tiny", True, 200, EVENT, id="stream-endless-event"),
    pytest.param(Mode.HUGE_HEADER_VALUE, "tiny", True, 502, HEAD, id="stream-huge-header"),
    pytest.param(Mode.ENDLESS_CHUNKED, "tiny", True, 502, BODY, id="stream-not-sse-endless"),
    pytest.param(Mode.ENDLESS_EVENT, R, False, 502, EVENT, id="reassembled-endless-event"),
    pytest.param(Mode.ENDLESS_LENGTH, R, False, 502, BODY, id="reassembled-endless-length"),
]


@pytest.mark.parametrize(("mode", "model", "streamed", "status", "code"), CASES)
def test_hostile_answer_is_bounded_and_the_next_request_is_served(
    stack: tuple[HostileEngine, GatewayProcess],
    mode: Mode,
    model: str,
    streamed: bool,
    status: int,
    code: str,
) -> None:
    """One hostile answer: RSS growth < 64 MiB, ``/healthz`` p99 < 100 ms, the documented
    error within the timeouts, then the engine heals and the next request to the same
    backend gets its own answer."""
    engine, gateway = stack
    log_offset = gateway.log_size()
    gateway.reset_peak()
    before = gateway.rss()
    engine.mode = mode
    try:
        with probing(gateway.url) as probe:
            started = time.monotonic()
            reply = _complete(gateway, "hostile", model=model, stream=streamed)
            seconds = time.monotonic() - started
            time.sleep(max(0.0, PROBE_S - seconds))
    finally:
        engine.mode = Mode.HEALTHY
    growth = gateway.peak_rss() - before
    if status == 200:
        error = _stream_error(reply)
    else:
        assert reply.status == status, reply
        error = openai_error(reply)
    assert error["code"] == code, error
    assert seconds < TIMEOUT_S + MARGIN_S, seconds
    assert growth < MAX_GROWTH, f"RSS grew {growth / 2**20:.0f} MiB"
    assert probe.failures == 0, probe.failures
    assert probe.p99() < MAX_P99_S, f"/healthz p99 {probe.p99() * 1000:.0f} ms"
    _assert_own_answer(gateway, model, f"next-after-{mode.value}")
    assert gateway.alive()
    log = gateway.log_since(log_offset)
    assert "Fatal error" not in log, log
    assert "Traceback" not in log, log


@pytest.mark.parametrize("after_s", [0.0, 0.05], ids=["same-write", "delayed"])
def test_unsolicited_answer_never_reaches_another_request(
    stack: tuple[HostileEngine, GatewayProcess], after_s: float
) -> None:
    """An engine that follows each answer with a second one nobody asked for (the same
    request id), at once or 50 ms later, while requests follow each other without a
    pause: no request ever gets that answer (the next one gets its own, or a 502
    ``upstream_protocol_error`` when the stray answer arrived after it was sent, matched
    by ``X-Request-Id``); once the engine heals, a request gets its own answer."""
    engine, gateway = stack
    engine.unsolicited_after_s = after_s
    engine.mode = Mode.UNSOLICITED
    replies = []
    try:
        for i in range(3):
            for which in ("first", "next"):
                prompt = f"{which}-{i}"
                reply = _complete(gateway, prompt)
                replies.append((prompt, reply))
    finally:
        engine.mode = Mode.HEALTHY
        engine.unsolicited_after_s = 0.0
    for prompt, reply in replies:
        if reply.status == 200:
            assert reply.json()["choices"][0]["text"] == prompt, (prompt, UNSOLICITED_TEXT, reply)
        else:
            assert (reply.status, openai_error(reply)["code"]) == (502, "upstream_protocol_error")
    time.sleep(0.1)  # a last stray answer arrives on an idle connection, which closes
    _assert_own_answer(gateway, "tiny", "healed")
