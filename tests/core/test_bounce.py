"""A backend that refused a running ticket's connection (``Scheduler.bounce``), and a request
that ended telling nothing of its engine (``Usage(ok=None)``): issue 27, "the gateway owns
its mistakes".

A bounce marks the backend down at once and puts the ticket back in its queue for another
backend, teaching the limit, the predictor and the fair-share counters nothing; it is
bounded by the ticket's expiry and by the backends left to try. A completion with
``ok=None`` (a gateway bug) leaves the circuit as it was.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

from sluicegate.core.decisions import Admit, Decision, ErrorCode, Expire
from sluicegate.core.entry import State
from sluicegate.core.scheduler import Scheduler
from sluicegate.core.spec import AdaptiveSpec
from sluicegate.core.ticket import Feedback, TicketId, Usage
from tests.core.conftest import LaneFactory, SpecFactory, TicketFactory

MODEL = "m"
D = TypeVar("D", Admit, Expire)


def only(decisions: Sequence[Decision], kind: type[D]) -> list[D]:
    """The decisions of one kind, in order."""
    return [d for d in decisions if isinstance(d, kind)]


def circuits(sched: Scheduler, now: float) -> dict[str, str]:
    """Each backend's circuit state at ``now``."""
    return {b.name: b.circuit for b in sched.view(MODEL, now).backends}


def test_a_refused_ticket_runs_on_the_other_backend_and_its_backend_is_down(
    make_spec: SpecFactory, make_lane: LaneFactory, make_ticket: TicketFactory
) -> None:
    """The bounce opens the refusing backend's circuit at once (one refusal, however many
    failures the circuit needs) and admits the ticket on the other backend; new tickets
    go there too."""
    spec = make_spec(make_lane(max_concurrency=8), backends=("b0", "b1"), circuit_failures=5)
    sched = Scheduler(spec)
    (first,) = only(sched.submit(make_ticket("a"), 0.0), Admit)
    refused = first.backend
    other = "b1" if refused == "b0" else "b0"
    (again,) = only(sched.bounce(TicketId("a"), 0.1), Admit)
    assert (again.ticket.id, again.backend) == ("a", other)
    assert circuits(sched, 0.1)[refused] == "open"
    assert sched.view(MODEL).running == 1
    placed = [only(sched.submit(make_ticket(f"n{i}"), 0.2), Admit)[0].backend for i in range(3)]
    assert placed == [other] * 3


def test_a_bounce_teaches_the_limit_and_the_fair_share_nothing(
    make_spec: SpecFactory, make_lane: LaneFactory, make_ticket: TicketFactory
) -> None:
    """An ``aimd`` limit, which a failure lowers, is unchanged by a bounce; a ``vtc`` lane's
    tenant counter is as it was after the ticket's first admission."""
    lane = make_lane(max_concurrency=8, policy="fair")
    spec = make_spec(
        lane, backends=("b0", "b1"), max_concurrency=8, adaptive=AdaptiveSpec(mode="aimd")
    )
    sched = Scheduler(spec)
    sched.submit(make_ticket("a"), 0.0)
    counter = sched.counter(MODEL, "main", "t")
    cap = sched.view(MODEL).cap
    sched.bounce(TicketId("a"), 0.1)
    assert sched.view(MODEL).cap == cap
    assert sched.counter(MODEL, "main", "t") == counter


def test_with_no_other_backend_healthy_the_ticket_expires_with_no_healthy_backend(
    make_spec: SpecFactory, make_lane: LaneFactory, make_ticket: TicketFactory
) -> None:
    """One backend, refused: the ticket ends with an ``Expire`` (503 ``no_healthy_backend``)
    advising a retry when the circuit lets a probe through, and the scheduler holds
    nothing of it."""
    spec = make_spec(make_lane(), circuit_cooldown_s=7.0)
    sched = Scheduler(spec)
    sched.submit(make_ticket("a"), 0.0)
    decisions = sched.bounce(TicketId("a"), 1.0)
    (expire,) = only(decisions, Expire)
    assert decisions == [expire]
    assert expire.code is ErrorCode.NO_HEALTHY_BACKEND
    assert expire.retry_after_s == 7.0
    assert sched.live_tickets() == 0
    assert sched.view(MODEL).running == 0


def test_a_waiting_room_holds_a_refused_ticket_and_retries_it_after_the_cooldown(
    make_spec: SpecFactory, make_lane: LaneFactory, make_ticket: TicketFactory
) -> None:
    """With ``wait_for_backends`` the refused ticket waits; the scheduler wakes when the
    circuit lets a probe through and admits it there; refused again, it waits again, until
    its queue timeout expires it."""
    spec = make_spec(
        make_lane(queue_timeout_s=20.0), circuit_cooldown_s=5.0, wait_for_backends=True
    )
    sched = Scheduler(spec)
    sched.submit(make_ticket("a"), 0.0)
    assert sched.bounce(TicketId("a"), 1.0) == []
    assert sched.state_of(TicketId("a")) is State.QUEUED
    assert sched.next_wakeup() == 6.0
    (admit,) = only(sched.tick(6.0), Admit)
    assert admit.ticket.id == "a"
    assert sched.bounce(TicketId("a"), 6.0) == []
    assert sched.state_of(TicketId("a")) is State.QUEUED
    (expire,) = only(sched.tick(20.0), Expire)
    assert expire.code is ErrorCode.QUEUE_TIMEOUT


def test_a_ticket_past_its_queue_timeout_is_not_queued_again(
    make_spec: SpecFactory, make_lane: LaneFactory, make_ticket: TicketFactory
) -> None:
    """The queue timeout counts from arrival: a ticket refused after it has passed expires
    (503 ``queue_timeout``) even though another backend is healthy."""
    spec = make_spec(make_lane(max_concurrency=8, queue_timeout_s=2.0), backends=("b0", "b1"))
    sched = Scheduler(spec)
    sched.submit(make_ticket("a"), 0.0)
    (expire,) = only(sched.bounce(TicketId("a"), 3.0), Expire)
    assert expire.code is ErrorCode.QUEUE_TIMEOUT
    assert sched.live_tickets() == 0


def test_bounces_are_bounded_by_the_number_of_backends(
    make_spec: SpecFactory, make_lane: LaneFactory, make_ticket: TicketFactory
) -> None:
    """A ticket refused by more backends than the model has ends (503
    ``no_healthy_backend``), even when a circuit has cooled down meanwhile."""
    spec = make_spec(make_lane(max_concurrency=8), backends=("b0", "b1"), circuit_cooldown_s=1.0)
    sched = Scheduler(spec)
    sched.submit(make_ticket("a"), 0.0)
    assert only(sched.bounce(TicketId("a"), 0.0), Admit)
    assert only(sched.bounce(TicketId("a"), 1.5), Admit)  # the first backend, half-open
    assert sched.view(MODEL, 3.0).backends[0].healthy or sched.view(MODEL, 3.0).backends[1].healthy
    (expire,) = only(sched.bounce(TicketId("a"), 3.0), Expire)
    assert expire.code is ErrorCode.NO_HEALTHY_BACKEND


def test_an_ending_that_says_nothing_of_the_engine_leaves_the_circuit_as_it_was(
    make_spec: SpecFactory, make_lane: LaneFactory, make_ticket: TicketFactory
) -> None:
    """``Usage(ok=None)`` (the gateway's own failure) neither resets the count of
    consecutive failures nor adds to it, and a half-open probe it was gives its turn
    back: the circuit stays half-open and lets the next request probe."""
    spec = make_spec(make_lane(max_concurrency=8), circuit_failures=2, circuit_cooldown_s=5.0)
    sched = Scheduler(spec)
    unknown = Usage(100, 0, ok=None)
    assert unknown.limit_feedback is Feedback.IGNORE
    sched.submit(make_ticket("a"), 0.0)
    sched.complete(TicketId("a"), Usage(100, 0, ok=False), 0.0)
    sched.submit(make_ticket("b"), 0.0)
    sched.complete(TicketId("b"), unknown, 0.0)
    assert circuits(sched, 0.0) == {"b0": "closed"}
    sched.submit(make_ticket("c"), 0.0)
    sched.complete(TicketId("c"), Usage(100, 0, ok=False), 0.0)
    assert circuits(sched, 0.0) == {"b0": "open"}
    (probe,) = only(sched.submit(make_ticket("d"), 5.0), Admit)
    sched.complete(probe.ticket.id, unknown, 5.0)
    assert circuits(sched, 5.0) == {"b0": "half_open"}
    assert only(sched.submit(make_ticket("e"), 5.0), Admit)


def test_an_ending_that_says_nothing_leaves_the_adaptive_limit(
    make_spec: SpecFactory, make_lane: LaneFactory, make_ticket: TicketFactory
) -> None:
    """An ``aimd`` limit that a failure lowers is left where it was by ``ok=None``."""
    spec = make_spec(
        make_lane(max_concurrency=8), max_concurrency=8, adaptive=AdaptiveSpec(mode="aimd")
    )
    sched = Scheduler(spec)
    cap = sched.view(MODEL).cap
    sched.submit(make_ticket("a"), 0.0)
    sched.complete(TicketId("a"), Usage(100, 0, ok=None), 1.0)
    assert sched.view(MODEL).cap == cap
    sched.submit(make_ticket("b"), 1.0)
    sched.complete(TicketId("b"), Usage(100, 0, ok=False), 2.0)
    assert sched.view(MODEL).cap < cap
