"""A batch line's outcome comes back typed (issue 28): no HTTP request is made up for it.

A line is served by ``Serving.serve_ticket``, the seam the HTTP handler calls too, and
the runner judges the ``Served`` it returns: a rejection's retry delay is read from
the outcome (no status code, no ``retry-after-ms`` header), a request the gateway
refuses for good comes back ``Failed`` with its error code. Real components: the
gateway's state (scheduler, driver, metrics), the SQLite batch backend in a temporary
directory, the runner's own loop. No engine is needed: nothing here is admitted.

The rate limit: tenant ``a`` may send one request per 100 s (burst 1); a ticket
submitted straight to the scheduler takes it, so the line that follows is refused
with a wait of (about) 100 s.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import orjson
import pytest

from sluicegate.batches.batch_backend import BatchBackend, NewBatch, NewFile
from sluicegate.batches.sqlite.sqlite_batches import SqliteBatches
from sluicegate.config import parse_config
from sluicegate.core.decisions import Admit
from sluicegate.core.ticket import Ticket, TicketId
from sluicegate.gateway.batch_lane.batch_metrics import BatchProgress
from sluicegate.gateway.batch_lane.line_dispatch import LineCall
from sluicegate.gateway.batch_lane.line_runner import BatchRunner
from sluicegate.gateway.request.serving import Failed, Rejected, Serving, TicketRequest
from sluicegate.gateway.state import GatewayState

MODEL = "tiny"
LANE = "best_effort"
ENDPOINT = "/v1/chat/completions"
PER_S = 0.01
"""Tenant ``a``'s rate: one request per 100 s."""
CONFIG = f"""models:
  - name: {MODEL}
    max_concurrency: 2
    backends: [{{name: e0, url: 'http://127.0.0.1:9'}}]
    lanes:
      - {{name: interactive, max_concurrency: 2}}
      - {{name: {LANE}, max_concurrency: 1}}
tenants:
  - {{name: a, api_key_env: KEY_A, requests_per_s: {PER_S}, burst_requests: 1}}
batches:
  path: {{db}}
  poll_interval_s: 0.05
"""


def _state(db: Path) -> GatewayState:
    return GatewayState(parse_config(CONFIG.replace("{db}", str(db))), environ={"KEY_A": "key-a"})


def _body(**fields: object) -> bytes:
    return orjson.dumps(
        {"model": MODEL, "messages": [{"role": "user", "content": "hello"}], **fields}
    )


async def _take_the_rate(state: GatewayState) -> None:
    """Spend tenant ``a``'s one request: a ticket straight to the scheduler, admitted."""
    ticket = Ticket(
        id=TicketId(f"{1:032x}"), model=MODEL, tenant="a", lane="interactive", priority=2,
        prompt_tokens=5, max_tokens=5, arrival=state.driver.now(),
    )  # fmt: skip
    assert isinstance(await state.driver.submit(ticket), Admit)


def _count(state: GatewayState, name: str, **labels: str) -> float:
    value = state.metrics.registry.get_sample_value(name, labels)
    return 0.0 if value is None else value


def _line_request(state: GatewayState) -> TicketRequest:
    """What the runner asks for a line of tenant ``a``'s batch in the best_effort lane."""
    return TicketRequest("a", state.driver.now(), lane=LANE, priority="5")


async def test_a_line_rejected_at_admission_brings_its_retry_delay_in_the_outcome(
    tmp_path: Path,
) -> None:
    """Over its tenant's rate, a line's ticket is refused at submission: ``serve_ticket``
    returns ``Rejected`` with the scheduler's wait (≈100 s, no header to read) and the
    refusal's error, counted ``rejected_rate_limit`` in the line's lane."""
    state = _state(tmp_path / "b.db")
    await _take_the_rate(state)
    serving = Serving(state, "chat", ENDPOINT)
    served = await LineCall("req_1").run(serving, _line_request(state), _body())
    assert isinstance(served, Rejected), served
    assert 99.0 < served.retry_after_s <= 1 / PER_S
    assert served.error is not None
    assert (served.error.status, served.error.code) == (429, "rate_limit_exceeded")
    requests = "sluicegate_requests_total"
    labels = {"model": MODEL, "lane": LANE}
    assert _count(state, requests, outcome="rejected_rate_limit", **labels) == 1


async def test_a_line_the_gateway_refuses_for_good_comes_back_failed_with_its_code(
    tmp_path: Path,
) -> None:
    """A line whose body the gateway refuses (``max_tokens`` 0; ``batches/lines.py`` does
    not read it) comes back ``Failed``: 400 ``invalid_request`` naming the field, not
    transient; no ticket was made, so nothing is counted."""
    state = _state(tmp_path / "b.db")
    serving = Serving(state, "chat", ENDPOINT)
    served = await LineCall("req_1").run(serving, _line_request(state), _body(max_tokens=0))
    assert isinstance(served, Failed), served
    error = served.error
    assert (error.status, error.code, error.param) == (400, "invalid_request", "max_tokens")
    assert not served.transient
    assert state.metrics.registry.get_sample_value("sluicegate_requests_total", {}) is None


@pytest.fixture
async def sqlite_backend(tmp_path: Path) -> AsyncIterator[BatchBackend]:
    """The batch backend the config names, open."""
    store = SqliteBatches(str(tmp_path / "b.db"))
    await store.open()
    try:
        yield store
    finally:
        await store.close()


async def _batch(backend: BatchBackend, body: bytes) -> str:
    """A ``validating`` batch of tenant ``a`` in the best_effort lane, of one line; its id."""
    line = {"custom_id": "only", "method": "POST", "url": ENDPOINT, "body": orjson.loads(body)}
    now = int(time.time())
    new_file = NewFile(tenant="a", purpose="batch", filename="in.jsonl", size=100, now=now)
    file = await backend.create_file(new_file, [orjson.dumps(line)])
    batch = await backend.create_batch(
        NewBatch(
            tenant="a",
            input_file_id=file["id"],
            endpoint=ENDPOINT,
            window="24h",
            window_s=86400,
            lane=LANE,
            metadata=None,
            now=now,
        )
    )
    return str(batch["id"])


async def _run_until(runner: BatchRunner, done: Callable[[], bool]) -> None:
    """Run the runner's loop until ``done()``, then stop it; stopping records what ended."""
    task = asyncio.create_task(runner.run())
    try:
        deadline = time.monotonic() + 10.0
        while not done():
            assert time.monotonic() < deadline, "the runner never got there"
            await asyncio.sleep(0.02)
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await runner.close()


def _runner(state: GatewayState, backend: BatchBackend) -> BatchRunner:
    spec = state.config.batches
    assert spec is not None
    progress = BatchProgress(state.metrics.registry, export_gauges=True)
    servers = {ENDPOINT: Serving(state, "chat", ENDPOINT)}
    return BatchRunner(state, spec, backend, servers, progress)


def _runs(state: GatewayState, outcome: str) -> float:
    return _count(state, "sluicegate_batch_line_runs_total", model=MODEL, outcome=outcome)


async def test_the_runner_defers_a_rejected_line_by_the_outcomes_delay(
    tmp_path: Path, sqlite_backend: BatchBackend
) -> None:
    """The runner sends a rejected line back to wait the rejection's delay, costing no
    attempt: counted ``deferred``, not claimable now nor in 98 s, claimable again in
    101 s with no attempt spent."""
    state, backend = _state(tmp_path / "b.db"), sqlite_backend
    await _batch(backend, _body())
    await _take_the_rate(state)
    runner = _runner(state, backend)
    await _run_until(runner, lambda: _runs(state, "deferred") == 1)
    assert _runs(state, "retried") == _runs(state, "failed") == 0
    now = time.time()
    assert await backend.claim(MODEL, "someone", 1, now + 98.0, 30.0) == []
    (again,) = await backend.claim(MODEL, "someone", 1, now + 101.0, 30.0)
    assert again.attempts == 0


async def test_the_runner_writes_a_failed_line_with_its_error(
    tmp_path: Path, sqlite_backend: BatchBackend
) -> None:
    """A line the gateway refuses for good is an error line at once (no retry): status 400
    and the error a client over HTTP would have read, code and field included."""
    state, backend = _state(tmp_path / "b.db"), sqlite_backend
    batch_id = await _batch(backend, _body(max_tokens=0))
    runner = _runner(state, backend)
    await _run_until(runner, lambda: _runs(state, "failed") == 1)
    assert _runs(state, "retried") == 0
    assert (await backend.batch_counts(batch_id)).failed == 1
    await backend.finish_due(int(time.time()))
    batch = await backend.get_batch("a", batch_id)
    assert batch is not None
    assert batch["status"] == "completed"
    page = await backend.file_page(str(batch["error_file_id"]), 0)
    (line,) = [orjson.loads(text) for text in page]
    response = line["response"]
    assert (line["custom_id"], response["status_code"]) == ("only", 400)
    error = response["body"]["error"]
    assert (error["code"], error["param"], error["type"]) == (
        "invalid_request",
        "max_tokens",
        "invalid_request_error",
    )
