"""The gateway owns its mistakes (issue 27): an engine that died between two probes costs its
requests no 502 (a bug in the gateway, a 500 that blames no engine: ``test_gateway_bugs.py``).

Engines are ``sluicegate emulate`` processes killed with ``SIGKILL`` (nothing listens on
their port afterwards); the probe interval is ten minutes, so only the refused
connections can tell the gateway. A request whose connection was
refused was never sent: it goes to another healthy backend, or waits (a waiting room), or
gets the scheduler's 503, and the dead backend is marked down at the first refusal.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import openai
import pytest

from sluicegate.demo.processes import free_port
from tests.batches.batch_harness import (
    ENVIRON,
    TENANTS,
    batches_section,
    by_custom_id,
    chat_line,
    file_lines,
    start_batch,
    wait_batch,
)
from tests.batches.batch_harness import client as batch_client
from tests.distributed.cluster import Child, spawn, stop_children, wait_ready
from tests.gateway.gateway_harness import (
    FAST_PRIORS,
    MODEL,
    Reply,
    Stack,
    assert_retry_headers,
    backend_state,
    engine_stats,
    gateway_at,
    http_call,
    metric,
    model_state,
    openai_error,
    outcomes,
    wait_until,
)

NEVER_PROBED = f"""    max_concurrency: 8
    circuit_cooldown_s: 60
{FAST_PRIORS}server: {{scrape_interval_s: 600}}
"""
SMALL = {"model": MODEL, "prompt": "owned", "max_tokens": 4}
REFUSAL = "refused the connection of request"


# ---------------------------------------------------------------------------- engines


def _spawn_engine(index: int, port: int, log_dir: Path) -> Child:
    args = ["emulate", "--port", str(port), "--preset", "tiny", "--model", MODEL]
    return spawn(f"engine-{index}-{port}", [*args, "--seed", str(index)], port, log_dir, {})


@contextmanager
def engine_processes(count: int, log_dir: Path) -> Iterator[list[Child]]:
    """``count`` emulated engines as processes, ready; stopped (whatever is left) on exit."""
    children: list[Child] = []
    try:
        for index in range(count):
            children.append(_spawn_engine(index, free_port(), log_dir))
        wait_ready([(child, "/health") for child in children])
        yield children
    finally:
        stop_children(children)


def _wait_up(gateway: Stack, *names: str) -> None:
    """Wait until every backend named has answered a probe (a gateway starts with its
    backends down), so that a request can be routed to any of them."""
    assert wait_until(lambda: all(backend_state(gateway.base_url, n)["healthy"] for n in names), 10)


def kill(engine: Child) -> None:
    """Kill the engine's process as a crash would (``SIGKILL``) and wait until it is gone."""
    engine.signal_group(signal.SIGKILL)
    engine.proc.wait(timeout=10)


def refusals(caplog: pytest.LogCaptureFixture, backend: str | None = None) -> int:
    """How many refused connections the gateway logged (of ``backend``, if given)."""
    prefix = "" if backend is None else f"backend {backend} "
    return sum(
        1 for r in caplog.records if REFUSAL in r.getMessage() and r.getMessage().startswith(prefix)
    )


def _completion(client: openai.OpenAI, stream: bool) -> str:
    """One completion through the official SDK (no retries of its own); its text."""
    if not stream:
        answer = client.completions.create(**SMALL)  # type: ignore[call-overload]
        return str(answer.choices[0].text)
    parts = []
    finished = None
    for chunk in client.completions.create(**SMALL, stream=True):  # type: ignore[call-overload]
        if chunk.choices:
            parts.append(chunk.choices[0].text)
            finished = chunk.choices[0].finish_reason or finished
    assert finished is not None, "the stream ended without a finish reason"
    return "".join(parts)


def _sdk(gateway: Stack) -> openai.OpenAI:
    return openai.OpenAI(base_url=gateway.base_url + "/v1", api_key="sk-open", max_retries=0)


# ---------------------------------------------------------------------------- refused


@pytest.mark.parametrize("stream", [False, True], ids=["unary", "stream"])
def test_requests_to_an_engine_killed_between_probes_go_to_the_other_engine(
    stream: bool, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Two engines; one is killed after both have served (pooled connections) and before
    any probe could see it. Twelve requests, six one after another and six at once, all
    succeed on the live engine: none is a 502. The dead backend is marked down by the first
    refusal (its circuit is open while its last probe still says up), each refusal is
    logged, and every request is counted once, ``completed``."""
    caplog.set_level(logging.WARNING, logger="sluicegate.gateway")
    with (
        engine_processes(2, tmp_path) as (e0, e1),
        gateway_at([e0.port, e1.port], NEVER_PROBED) as gateway,
        _sdk(gateway) as client,
    ):
        warm = [_completion(client, stream) for _ in range(4)]
        _wait_up(gateway, "e0", "e1")
        kill(e0)
        served_before = engine_stats(e1.url)["admitted_total"]
        texts = [_completion(client, stream) for _ in range(6)]
        with _threads(6) as run:
            texts += run(lambda: _completion(client, stream))
        dead = backend_state(gateway.base_url, "e0")
        served = engine_stats(e1.url)["admitted_total"] - served_before
        counted = outcomes(gateway.base_url)
    assert all(warm)
    assert len(texts) == 12
    assert all(texts)
    assert (dead["circuit"], dead["healthy"], dead["probe_healthy"]) == ("open", False, True)
    assert served == 12
    assert refusals(caplog, "e0") >= 1
    # The SDK hangs up right after a stream's ``[DONE]``, often before the engine's own end
    # reaches the gateway: such a stream was served whole and counts ``completed``.
    assert counted == {"completed": 16.0}


def test_an_engine_killed_between_probes_with_no_other_is_503_not_502(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The only engine is killed between probes: a request gets 503 ``no_healthy_backend``
    with retry headers at once (the refused connection sent nothing), never a 502; the
    backend is down; the next request, streamed, is refused the same without a connection
    attempt."""
    caplog.set_level(logging.WARNING, logger="sluicegate.gateway")
    with (
        engine_processes(1, tmp_path) as (e0,),
        gateway_at([e0.port], NEVER_PROBED) as gateway,
    ):
        assert http_call(gateway.base_url, "POST", "/v1/completions", json=SMALL).status == 200
        kill(e0)
        started = time.monotonic()
        reply = http_call(gateway.base_url, "POST", "/v1/completions", json=SMALL)
        took = time.monotonic() - started
        streamed = http_call(
            gateway.base_url, "POST", "/v1/completions", json={**SMALL, "stream": True}
        )
        circuit = backend_state(gateway.base_url, "e0")["circuit"]
        counted = outcomes(gateway.base_url)
    for one in (reply, streamed):
        assert one.status == 503, one
        assert openai_error(one)["code"] == "no_healthy_backend"
        assert_retry_headers(one)
    assert took < 1.0
    assert circuit == "open"
    assert refusals(caplog) == 1
    assert counted == {"completed": 1.0, "rejected_unavailable": 2.0}


@pytest.mark.parametrize("stream", [False, True], ids=["unary", "stream"])
def test_two_dead_engines_are_each_tried_once_then_503(
    stream: bool, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Both engines killed between probes: the request is refused by one, re-routed to the
    other, refused again, and then gets 503 ``no_healthy_backend``: each backend tried once,
    both marked down, no 502."""
    caplog.set_level(logging.WARNING, logger="sluicegate.gateway")
    with (
        engine_processes(2, tmp_path) as (e0, e1),
        gateway_at([e0.port, e1.port], NEVER_PROBED) as gateway,
    ):
        _wait_up(gateway, "e0", "e1")
        kill(e0)
        kill(e1)
        reply = http_call(
            gateway.base_url, "POST", "/v1/completions", json={**SMALL, "stream": stream}
        )
        circuits = [backend_state(gateway.base_url, name)["circuit"] for name in ("e0", "e1")]
    assert reply.status == 503, reply
    assert openai_error(reply)["code"] == "no_healthy_backend"
    assert circuits == ["open", "open"]
    assert (refusals(caplog, "e0"), refusals(caplog, "e1")) == (1, 1)


def test_batch_lines_sent_to_an_engine_killed_between_probes_go_to_the_other_engine(
    tmp_path: Path,
) -> None:
    """Batch lines run through the same handler: with one of two engines killed between
    probes, every line of a batch completes (200) on the other engine at its first run:
    no line is retried for a 502, and no request is counted as an engine failure."""
    body = NEVER_PROBED + TENANTS + batches_section(tmp_path / "batches.db")
    with (
        engine_processes(2, tmp_path) as (e0, e1),
        gateway_at([e0.port, e1.port], body, environ=ENVIRON) as gateway,
        batch_client(gateway) as sdk,
    ):
        _wait_up(gateway, "e0", "e1")
        kill(e0)
        lines = [chat_line(f"line-{i}") for i in range(10)]
        batch = wait_batch(sdk, start_batch(sdk, lines).id)
        output = by_custom_id(file_lines(sdk, batch.output_file_id))
        retried = metric(
            gateway.base_url, "sluicegate_batch_line_runs_total", model=MODEL, outcome="retried"
        )
        counted = outcomes(gateway.base_url)
        circuit = backend_state(gateway.base_url, "e0")["circuit"]
    assert batch.status == "completed", batch
    assert sorted(output) == sorted(line["custom_id"] for line in lines)
    assert {line["response"]["status_code"] for line in output.values()} == {200}
    assert not retried
    assert counted == {"completed": 10.0}
    assert circuit == "open"


WAITING_ROOM = f"""    max_concurrency: 4
    wait_for_backends: true
    circuit_cooldown_s: 0.5
    lanes:
      - {{name: interactive, max_concurrency: 4, queue_timeout_s: QUEUE_TIMEOUT}}
{FAST_PRIORS}server: {{scrape_interval_s: 600}}
"""


def test_a_waiting_room_holds_a_refused_request_until_the_engine_is_back(
    tmp_path: Path,
) -> None:
    """A waiting-room model whose only engine was killed between probes: the refused request
    goes back to the queue (not a 502), is tried again each time the circuit cools down,
    and completes once the engine is started again on its port."""
    body = WAITING_ROOM.replace("QUEUE_TIMEOUT", "30")
    with (
        engine_processes(1, tmp_path) as engines,
        gateway_at([engines[0].port], body) as gateway,
    ):
        assert wait_until(lambda: backend_state(gateway.base_url, "e0")["healthy"], 5)
        kill(engines[0])
        call = _in_background(lambda: http_call(gateway.base_url, "POST", "/v1/completions",
                                                json=SMALL, timeout=30))  # fmt: skip
        held = wait_until(lambda: model_state(gateway.base_url)["queued"] == 1, 5)
        engines.append(_spawn_engine(0, engines[0].port, tmp_path))
        wait_ready([(engines[-1], "/health")])
        reply = call()
        counted = outcomes(gateway.base_url)
    assert held, "the refused request should wait in the queue"
    assert reply.status == 200, reply
    assert counted == {"completed": 1.0}


def test_a_waiting_room_whose_engine_stays_dead_times_out_in_the_queue(tmp_path: Path) -> None:
    """The same with the engine never back: the request waits out its queue timeout and gets
    503 ``queue_timeout`` with retry headers, not a 502."""
    body = WAITING_ROOM.replace("QUEUE_TIMEOUT", "2")
    with (
        engine_processes(1, tmp_path) as (e0,),
        gateway_at([e0.port], body) as gateway,
    ):
        assert wait_until(lambda: backend_state(gateway.base_url, "e0")["healthy"], 5)
        kill(e0)
        started = time.monotonic()
        reply = http_call(gateway.base_url, "POST", "/v1/completions", json=SMALL)
        waited = time.monotonic() - started
        counted = outcomes(gateway.base_url)
    assert reply.status == 503, reply
    assert openai_error(reply)["code"] == "queue_timeout"
    assert_retry_headers(reply)
    assert 1.9 <= waited < 3.0, waited
    assert counted == {"expired": 1.0}


# ---------------------------------------------------------------------------- helpers


@contextmanager
def _threads(count: int) -> Iterator[Callable[[Callable[[], str]], list[str]]]:
    """``run(fn)`` calls ``fn`` in ``count`` threads at once and returns their results."""

    def run(fn: Callable[[], str]) -> list[str]:
        results: list[str] = []
        errors: list[BaseException] = []
        barrier = threading.Barrier(count)

        def one() -> None:
            barrier.wait()
            try:
                results.append(fn())
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=one) for _ in range(count)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=30)
        assert not errors, errors
        return results

    yield run


def _in_background(fn: Callable[[], Reply]) -> Callable[[], Reply]:
    """Start ``fn`` in a thread; the returned function waits for and returns its result."""
    box: list[Reply] = []
    thread = threading.Thread(target=lambda: box.append(fn()), daemon=True)
    thread.start()

    def result() -> Reply:
        thread.join(timeout=40)
        assert box, "the background request did not finish"
        return box[0]

    return result
