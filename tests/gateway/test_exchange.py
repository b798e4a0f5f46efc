"""``Exchange.finish``: a request's ticket ends exactly once, however many paths try to end it.

Driven through the real scheduler, driver and metrics of a ``GatewayState`` (no HTTP is
needed to hand a ticket to the scheduler and end it).
"""

from __future__ import annotations

from starlette.types import Message

from sluicegate.config import parse_config
from sluicegate.core.decisions import Admit
from sluicegate.core.ticket import Feedback, Outcome, Ticket, TicketId, Usage
from sluicegate.gateway.http_errors import GatewayError
from sluicegate.gateway.request.asgi_send import HttpSink
from sluicegate.gateway.request.exchange import Exchange
from sluicegate.gateway.state import GatewayState

CONFIG = """models:
  - name: tiny
    max_concurrency: 1
    backends: [{name: e0, url: 'http://127.0.0.1:9'}]
    lanes: [{name: only, max_concurrency: 1}]
"""


async def _receive() -> Message:
    raise AssertionError("nothing is read in these tests")


async def _send(message: Message) -> None:
    raise AssertionError("nothing is sent in these tests")


def _exchange(state: GatewayState, number: int) -> Exchange:
    ticket = Ticket(
        id=TicketId(f"{number:032x}"), model="tiny", tenant="anonymous", lane="only",
        priority=2, prompt_tokens=10, max_tokens=20, arrival=state.driver.now(),
    )  # fmt: skip
    sink = HttpSink({}, _receive, _send)
    return Exchange(sink, ticket, b"{}", state.driver, state.metrics)


def _count(state: GatewayState, name: str, **labels: str) -> float:
    value = state.metrics.registry.get_sample_value(name, labels)
    return 0.0 if value is None else value


def _ended(state: GatewayState, outcome: Outcome) -> float:
    return _count(
        state, "sluicegate_requests_total", model="tiny", lane="only", outcome=outcome.value
    )


async def _admitted(state: GatewayState, number: int) -> Exchange:
    exchange = _exchange(state, number)
    verdict = await state.driver.submit(exchange.ticket)
    assert isinstance(verdict, Admit)
    exchange.admitted(verdict)
    return exchange


async def test_a_second_finish_is_a_no_op() -> None:
    """The first ``finish`` completes the running ticket (slot back, outcome, duration and
    tokens counted once); a second, even with another outcome and usage, returns False and
    changes nothing."""
    state = GatewayState(parse_config(CONFIG), environ={})
    exchange = await _admitted(state, 1)
    assert state.scheduler.view("tiny", state.driver.now()).running == 1
    first = exchange.finish(Outcome.COMPLETED, Usage(10, 5, feedback=Feedback.SAMPLE))
    second = exchange.finish(Outcome.UPSTREAM_ERROR, exchange.cut_short(7, ok=False))
    assert (first, second) == (True, False)
    assert exchange.outcome is Outcome.COMPLETED
    assert state.scheduler.view("tiny", state.driver.now()).running == 0
    assert _ended(state, Outcome.COMPLETED) == 1
    assert _ended(state, Outcome.UPSTREAM_ERROR) == 0
    duration = "sluicegate_request_duration_seconds_count"
    assert _count(state, duration, model="tiny", lane="only") == 1
    completion = "sluicegate_tokens_total"
    assert _count(state, completion, model="tiny", tenant="other", kind="completion") == 5


async def test_fail_after_finish_keeps_the_first_outcome() -> None:
    """``fail`` (how engine errors end an exchange) after a finish still only returns the
    error: the outcome stays the first one and nothing more is counted."""
    state = GatewayState(parse_config(CONFIG), environ={})
    exchange = await _admitted(state, 1)
    exchange.finish(Outcome.CANCELLED)
    error = GatewayError(502, "upstream_error", "the engine failed")
    assert exchange.fail(error) is error
    assert exchange.outcome is Outcome.CANCELLED
    assert (_ended(state, Outcome.CANCELLED), _ended(state, Outcome.UPSTREAM_ERROR)) == (1, 0)


async def test_finishing_a_waiting_ticket_takes_it_out_of_its_queue() -> None:
    """A ticket that waits behind a running one and is finished (its client left) leaves its
    queue at once; the running one is untouched."""
    state = GatewayState(parse_config(CONFIG), environ={})
    running = await _admitted(state, 1)
    waiting = _exchange(state, 2)
    future = state.driver.submit(waiting.ticket)
    assert not future.done()
    assert state.scheduler.view("tiny", state.driver.now()).queued == 1
    assert waiting.finish(Outcome.CANCELLED)
    assert not waiting.finish(Outcome.CANCELLED)
    view = state.scheduler.view("tiny", state.driver.now())
    assert (view.queued, view.running) == (0, 1)
    assert future.cancelled()
    assert running.outcome is None
    assert _ended(state, Outcome.CANCELLED) == 1
