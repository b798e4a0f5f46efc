"""What the scheduler reports to a model's adaptive limit when a request ends (DESIGN §5).

Every test drives the real ``Scheduler`` with explicit ``now`` values and reads
the effective limit from ``ModelView.cap``. Lanes come from the ``make_lane``
fixture (fifo, never preemptible, hour-long timeouts).
"""

from __future__ import annotations

import pytest

from sluicegate.core.decisions import Admit
from sluicegate.core.limits import Limit, SampleKind
from sluicegate.core.limits.feedback import report_outcome
from sluicegate.core.scheduler import Scheduler
from sluicegate.core.spec import AdaptiveSpec
from sluicegate.core.ticket import Feedback, Ticket, Usage
from tests.core.conftest import LaneFactory, SpecFactory, TicketFactory

MODEL = "m"
CAP = 8
OUTPUT_TOKENS = 20


class _Harness:
    """A scheduler with one adaptive model of cap ``CAP`` and ticket names that never repeat."""

    def __init__(
        self,
        make_spec: SpecFactory,
        make_lane: LaneFactory,
        make_ticket: TicketFactory,
        **adaptive: object,
    ) -> None:
        spec = make_spec(
            make_lane(max_concurrency=CAP),
            max_concurrency=CAP,
            adaptive=AdaptiveSpec.model_validate({"floor": 1, **adaptive}),
        )
        self.sched = Scheduler(spec)
        self._make_ticket = make_ticket
        self._next = 0

    @property
    def cap(self) -> int:
        return self.sched.view(MODEL).cap

    def start(self, count: int, now: float, *, streaming: bool = False) -> list[Ticket]:
        """Submit ``count`` tickets at ``now``; all must be admitted."""
        tickets = []
        for _ in range(count):
            self._next += 1
            ticket = self._make_ticket(f"t{self._next}", arrival=now, streaming=streaming)
            decisions = self.sched.submit(ticket, now)
            assert any(isinstance(d, Admit) for d in decisions), decisions
            tickets.append(ticket)
        return tickets

    def run(self, usage: Usage, *, start: float, end: float, count: int = 1) -> None:
        """``count`` tickets (the cap at most) admitted at ``start`` all end at ``end`` with
        ``usage``."""
        for ticket in self.start(min(count, self.cap), start):
            self.sched.complete(ticket.id, usage, end)


@pytest.mark.parametrize("mode", ["aimd", "latency"])
def test_an_upstream_failure_is_a_drop(
    make_spec: SpecFactory, make_lane: LaneFactory, make_ticket: TicketFactory, mode: str
) -> None:
    """A request whose upstream failed (``ok=False``: a 5xx, an unreachable engine, a
    timeout) lowers an ``aimd`` or ``latency`` limit, even with nothing else running."""
    h = _Harness(make_spec, make_lane, make_ticket, mode=mode)
    h.run(Usage(100, 0, ok=False), start=0.0, end=1.0)
    assert h.cap == CAP - 1
    h.run(Usage(100, 0, ok=False), start=1.0, end=2.0)
    assert h.cap == CAP - 2


@pytest.mark.parametrize("mode", ["aimd", "latency"])
def test_an_engine_refusal_for_load_is_a_drop(
    make_spec: SpecFactory, make_lane: LaneFactory, make_ticket: TicketFactory, mode: str
) -> None:
    """The engine's 429 (reported ``ok`` so the circuit stays closed, with
    ``Feedback.DROP``) lowers the limit and leaves the backend healthy."""
    h = _Harness(make_spec, make_lane, make_ticket, mode=mode, decrease=0.5)
    for second in range(6):
        h.run(Usage(100, 0, feedback=Feedback.DROP), start=second, end=second + 0.5)
    assert h.cap < CAP - 2
    assert h.sched.view(MODEL).backends[0].healthy


def test_kv_cache_mode_ignores_drops(
    make_spec: SpecFactory, make_lane: LaneFactory, make_ticket: TicketFactory
) -> None:
    """``kv_cache`` follows KV usage only; failed requests leave it at the cap."""
    h = _Harness(make_spec, make_lane, make_ticket, mode="kv_cache")
    h.run(Usage(100, 0, ok=False), start=0.0, end=1.0, count=CAP)
    assert h.cap == CAP


def test_client_mistakes_and_disconnects_tell_the_limit_nothing(
    make_spec: SpecFactory, make_lane: LaneFactory, make_ticket: TicketFactory
) -> None:
    """After a drop (8 → 7), requests ended with ``Feedback.IGNORE`` (a client's 4xx, a
    disconnect; even one reported as failed) or cancelled, however busy the model, neither
    lower an ``aimd`` limit nor count as the successes that would raise it back to 8."""
    h = _Harness(make_spec, make_lane, make_ticket, mode="aimd")
    h.run(Usage(100, 0, ok=False), start=0.0, end=1.0)
    assert h.cap == CAP - 1
    ignored = Usage(100, 0, ttft_s=0.1, feedback=Feedback.IGNORE)
    h.run(ignored, start=1.0, end=2.0, count=CAP)
    failed_but_ignored = Usage(100, 0, ok=False, feedback=Feedback.IGNORE)
    h.run(failed_but_ignored, start=2.0, end=3.0, count=3)
    for ticket in h.start(CAP - 1, 3.0):
        h.sched.cancel(ticket.id, 4.0)
    assert h.cap == CAP - 1
    h.run(Usage(100, OUTPUT_TOKENS), start=4.0, end=5.0, count=CAP)
    assert h.cap == CAP


def test_a_unary_success_is_a_latency_sample_for_aimd(
    make_spec: SpecFactory, make_lane: LaneFactory, make_ticket: TicketFactory
) -> None:
    """A non-streamed success (no time to first token) under load is a good sample that
    grows an ``aimd`` limit back after drops, even when it took longer than ``timeout_s``
    in all (the timeout judges time to first token, not a whole answer)."""
    h = _Harness(make_spec, make_lane, make_ticket, mode="aimd", timeout_s=1.0)
    for second in range(3):
        h.run(Usage(100, 0, ok=False), start=second, end=second + 0.5)
    assert h.cap == CAP - 3
    for start in (10.0, 20.0, 30.0):
        h.run(Usage(100, OUTPUT_TOKENS), start=start, end=start + 3.0, count=CAP)
    assert h.cap == CAP


def test_rising_time_per_output_token_of_unary_answers_lowers_the_latency_limit(
    make_spec: SpecFactory, make_lane: LaneFactory, make_ticket: TicketFactory
) -> None:
    """``latency`` mode on non-streamed traffic: answers of 20 tokens that take 0.4 s under
    load set the long-run level (0.02 s per output token); once they take 2 s (0.1 s per
    token) the limit falls below the cap."""
    h = _Harness(make_spec, make_lane, make_ticket, mode="latency")
    now = 0.0
    for _ in range(10):
        h.run(Usage(100, OUTPUT_TOKENS), start=now, end=now + 0.4, count=CAP)
        now += 1.0
    assert h.cap == CAP
    for _ in range(3):
        h.run(Usage(100, OUTPUT_TOKENS), start=now, end=now + 2.0, count=CAP)
        now += 3.0
    assert h.cap < CAP


def test_streams_and_unary_answers_are_judged_apart(
    make_spec: SpecFactory, make_lane: LaneFactory, make_ticket: TicketFactory
) -> None:
    """A model serving streams (time to first token 0.2 s) and unary answers (0.4 s for 20
    tokens: 0.02 s per token) in alternation keeps its ``latency`` limit at the cap even at
    tolerance 1: each kind is compared only with its own history."""
    h = _Harness(make_spec, make_lane, make_ticket, mode="latency", tolerance=1.0)
    now = 0.0
    for _ in range(10):
        for ticket in h.start(CAP, now, streaming=True):
            h.sched.complete(ticket.id, Usage(100, OUTPUT_TOKENS, ttft_s=0.2), now + 0.4)
        h.run(Usage(100, OUTPUT_TOKENS), start=now + 0.5, end=now + 0.9, count=CAP)
        now += 1.0
    assert h.cap == CAP


class _Recording(Limit):
    """A real limit that records each listener call instead of moving."""

    __slots__ = ("calls",)

    name = "recording"

    def __init__(self) -> None:
        super().__init__(AdaptiveSpec(), CAP)
        self.calls: list[tuple[object, ...]] = []

    def on_success(self, rtt_s: float, *, inflight: int, kind: SampleKind) -> None:
        self.calls.append(("success", rtt_s, inflight, kind))

    def on_dropped(self, *, inflight: int) -> None:
        self.calls.append(("dropped", inflight))

    def on_ignore(self) -> None:
        self.calls.append(("ignore",))


@pytest.mark.parametrize(
    ("usage", "call"),
    [
        (Usage(100, 20, ttft_s=0.3), ("success", 0.3, 5, SampleKind.FIRST_TOKEN)),
        (Usage(100, 20), ("success", 0.1, 5, SampleKind.PER_OUTPUT_TOKEN)),
        (Usage(100, 0), ("success", 2.0, 5, SampleKind.PER_OUTPUT_TOKEN)),
        (Usage(100, 0, ok=False), ("dropped", 5)),
        (Usage(100, 20, ttft_s=0.3, feedback=Feedback.DROP), ("dropped", 5)),
        (Usage(100, 20, ttft_s=0.3, feedback=Feedback.IGNORE), ("ignore",)),
        (Usage(100, 0, ok=False, feedback=Feedback.IGNORE), ("ignore",)),
    ],
)
def test_each_finished_request_is_exactly_one_listener_call(
    usage: Usage, call: tuple[object, ...]
) -> None:
    """``report_outcome`` makes one call per request (2 s from admission, 5 in flight):
    a success with the time to first token when there is one, else the time per output token
    (at least one token); a drop; or an ignore."""
    limit = _Recording()
    report_outcome(limit, usage, elapsed_s=2.0, inflight=5)
    assert limit.calls == [call]
