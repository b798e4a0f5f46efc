"""Lane ordering policies, observed through the real Scheduler (DESIGN §6).

Each test uses one lane with ``max_concurrency`` 1: a blocker takes the slot,
the tickets under test queue behind it, and completing the running ticket
again and again reveals the queue order as the sequence of ``Admit`` decisions.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from sluicegate.core.decisions import Admit, Decision
from sluicegate.core.policies import ORDERINGS
from sluicegate.core.scheduler import Scheduler
from sluicegate.core.spec import TenantSpec
from sluicegate.core.ticket import Ticket, Usage
from tests.core.conftest import LaneFactory, SpecFactory, TicketFactory

MODEL = "m"
LANE = "main"
DECODE_S = 1.0 / 40.0  # ModelSpec.prior_decode_tokens_per_s = 40


def output_of(ticket: Ticket) -> int:
    """The output a ticket 'really' produces: its true length, else its prediction, else 1."""
    if ticket.true_output_tokens is not None:
        return ticket.true_output_tokens
    return ticket.predicted_output_tokens or 1


def admits(decisions: Sequence[Decision]) -> list[Ticket]:
    """Tickets admitted by ``decisions``, in order."""
    return [d.ticket for d in decisions if isinstance(d, Admit)]


def start(sched: Scheduler, blocker: Ticket, now: float) -> Ticket:
    """Submit ``blocker`` into an idle one-slot lane; it must run at once."""
    assert admits(sched.submit(blocker, now)) == [blocker]
    return blocker


def drain(sched: Scheduler, running: Ticket, now: float) -> list[Ticket]:
    """Complete the running ticket until the lane is empty; the tickets in admission order."""
    order: list[Ticket] = []
    current: Ticket | None = running
    while current is not None:
        usage = Usage(prompt_tokens=current.prompt_tokens, completion_tokens=output_of(current))
        admitted = admits(sched.complete(current.id, usage, now))
        assert len(admitted) <= 1, "a one-slot lane admitted two tickets at once"
        current = admitted[0] if admitted else None
        if current is not None:
            order.append(current)
    return order


# ---------------------------------------------------------------------------- fifo


@settings(max_examples=60, deadline=None)
@given(arrivals=st.lists(st.floats(0.0, 1000.0, allow_nan=False), min_size=1, max_size=25))
def test_fifo_serves_in_arrival_order(
    arrivals: list[float],
    make_spec: SpecFactory,
    make_lane: LaneFactory,
    make_ticket: TicketFactory,
) -> None:
    """fifo admits by the ticket's arrival time, whatever order they were submitted in.

    Equal arrivals keep submission order.
    """
    sched = Scheduler(make_spec(make_lane(policy="fifo")))
    now = 1000.0
    blocker = start(sched, make_ticket("blocker", arrival=now), now)
    tickets = [make_ticket(f"q{i}", arrival=a) for i, a in enumerate(arrivals)]
    for ticket in tickets:
        sched.submit(ticket, now)
    expected = sorted(tickets, key=lambda t: t.arrival)  # stable: ties by submission
    assert drain(sched, blocker, now) == expected


# ---------------------------------------------------------------------------- priority


@settings(max_examples=80, deadline=None)
@given(ops=st.lists(st.one_of(st.none(), st.integers(0, 5)), max_size=40))
def test_priority_never_serves_lower_while_higher_waits(
    ops: list[int | None],
    make_spec: SpecFactory,
    make_lane: LaneFactory,
    make_ticket: TicketFactory,
) -> None:
    """priority: every admitted ticket is at least as important as anything still queued.

    Among equal priorities, the earliest arrival is admitted first. ``ops`` is
    a random interleaving of submissions (with a priority) and completions.
    """
    sched = Scheduler(make_spec(make_lane(policy="priority")))
    queued: dict[str, Ticket] = {}
    running: Ticket | None = None
    for step, op in enumerate(ops):
        now = float(step)
        if op is None:
            if running is None:
                continue
            out = sched.complete(running.id, Usage(running.prompt_tokens, 1), now)
            running = None
        else:
            ticket = make_ticket(f"q{step}", priority=op, arrival=now)
            queued[ticket.id] = ticket
            out = sched.submit(ticket, now)
        for ticket in admits(out):
            del queued[ticket.id]
            for waiting in queued.values():
                assert (waiting.priority, waiting.arrival) > (ticket.priority, ticket.arrival)
            running = ticket


def test_priority_orders_by_priority_then_arrival(
    make_spec: SpecFactory, make_lane: LaneFactory, make_ticket: TicketFactory
) -> None:
    """priority: (priority, arrival) ascending — 0 before 5, earlier before later."""
    sched = Scheduler(make_spec(make_lane(policy="priority")))
    blocker = start(sched, make_ticket("blocker"), 0.0)
    specs = [("a", 3, 1.0), ("b", 1, 4.0), ("c", 3, 0.5), ("d", 0, 9.0), ("e", 1, 2.0)]
    for name, priority, arrival in specs:
        sched.submit(make_ticket(name, priority=priority, arrival=arrival), 10.0)
    assert [t.id for t in drain(sched, blocker, 10.0)] == ["d", "e", "b", "c", "a"]


# ---------------------------------------------------------------------------- sjf


@settings(max_examples=60, deadline=None)
@given(predicted=st.lists(st.integers(1, 4000), min_size=1, max_size=25))
def test_sjf_serves_shorter_predicted_jobs_first(
    predicted: list[int],
    make_spec: SpecFactory,
    make_lane: LaneFactory,
    make_ticket: TicketFactory,
) -> None:
    """sjf: with equal arrivals and prompts, smaller predicted output is admitted first."""
    sched = Scheduler(make_spec(make_lane(policy="sjf")))
    blocker = start(sched, make_ticket("blocker"), 0.0)
    tickets = [make_ticket(f"q{i}", predicted=p, max_tokens=4000) for i, p in enumerate(predicted)]
    for ticket in tickets:
        sched.submit(ticket, 0.0)
    expected = sorted(tickets, key=lambda t: t.predicted_output_tokens or 0)
    assert drain(sched, blocker, 0.0) == expected


LONG_TOKENS = 1000
SHORT_TOKENS = 10


def long_job_admitted_at(
    aging: float,
    steps: int,
    make_spec: SpecFactory,
    make_lane: LaneFactory,
    make_ticket: TicketFactory,
) -> int | None:
    """Step at which a long job is admitted under a steady stream of short jobs, or None.

    At t=0 a long job queues behind a blocker. At each step k = 1, 2, … one
    short job arrives (at t=k) and the running job completes, so the queue
    always holds the long job plus one fresh short one.
    """
    sched = Scheduler(make_spec(make_lane(policy="sjf", aging=aging)))
    running = start(sched, make_ticket("blocker", predicted=SHORT_TOKENS), 0.0)
    sched.submit(make_ticket("long", predicted=LONG_TOKENS, max_tokens=LONG_TOKENS), 0.0)
    for k in range(1, steps + 1):
        now = float(k)
        sched.submit(make_ticket(f"s{k}", predicted=SHORT_TOKENS, arrival=now), now)
        (running,) = admits(sched.complete(running.id, Usage(100, SHORT_TOKENS), now))
        if running.id == "long":
            return k
    return None


def aging_bound(aging: float) -> int:
    """First step k with ``S_short + aging·k > S_long``: when aging lets the long job win."""
    gap_s = (LONG_TOKENS - SHORT_TOKENS) * DECODE_S
    return math.floor(gap_s / aging) + 1


def test_sjf_without_aging_starves_long_job(
    make_spec: SpecFactory, make_lane: LaneFactory, make_ticket: TicketFactory
) -> None:
    """sjf with aging 0: a steady stream of short jobs keeps a long job waiting indefinitely."""
    steps = 3 * aging_bound(1.0)
    assert long_job_admitted_at(0.0, steps, make_spec, make_lane, make_ticket) is None


@pytest.mark.parametrize("aging", [0.5, 1.0, 4.0])
def test_sjf_aging_bounds_starvation(
    aging: float, make_spec: SpecFactory, make_lane: LaneFactory, make_ticket: TicketFactory
) -> None:
    """sjf with aging a > 0: a long job is served within ⌊(S_long − S_short)/a⌋ + 1 arrivals.

    Key = service_s + a·arrival, so a short job arriving k seconds after the
    long one outranks it only while S_short + a·k < S_long.
    """
    bound = aging_bound(aging)
    step = long_job_admitted_at(aging, 2 * bound, make_spec, make_lane, make_ticket)
    assert step is not None
    assert 1 < step <= bound


# ---------------------------------------------------------------------------- slack


@settings(max_examples=60, deadline=None)
@given(
    jobs=st.lists(
        st.tuples(st.integers(10, 600), st.integers(1, 2000), st.integers(0, 5)),
        min_size=1,
        max_size=20,
    )
)
def test_slack_serves_least_deadline_minus_service_first(
    jobs: list[tuple[int, int, int]],
    make_spec: SpecFactory,
    make_lane: LaneFactory,
    make_ticket: TicketFactory,
) -> None:
    """slack: admitted in order of (deadline − predicted service, priority).

    Service = prefill + predicted_output · decode_s_per_token; with no prompt
    the prefill is zero and the decode rate is the model's prior.
    """
    sched = Scheduler(make_spec(make_lane(policy="slack")))
    blocker = start(sched, make_ticket("blocker"), 0.0)
    tickets = [
        make_ticket(
            f"q{i}",
            deadline=float(deadline),
            predicted=tokens,
            max_tokens=2000,
            priority=priority,
            prompt_tokens=0,
        )
        for i, (deadline, tokens, priority) in enumerate(jobs)
    ]
    for ticket in tickets:
        sched.submit(ticket, 0.0)

    def key(ticket: Ticket) -> tuple[float, int]:
        assert ticket.deadline is not None
        service_s = 0.0 + (ticket.predicted_output_tokens or 0) * DECODE_S
        return (ticket.deadline - service_s, ticket.priority)

    assert drain(sched, blocker, 0.0) == sorted(tickets, key=key)


def test_slack_prefers_least_slack_over_earliest_deadline(
    make_spec: SpecFactory, make_lane: LaneFactory, make_ticket: TicketFactory
) -> None:
    """slack: a big job with a later deadline but less slack runs before a small urgent one."""
    sched = Scheduler(make_spec(make_lane(policy="slack")))
    blocker = start(sched, make_ticket("blocker"), 0.0)
    # big: deadline 100, service 2000/40 = 50 s → slack 50; small: deadline 60, 1 s → slack 59.
    big = make_ticket("big", deadline=100.0, predicted=2000, max_tokens=2000, prompt_tokens=0)
    small = make_ticket("small", deadline=60.0, predicted=40, prompt_tokens=0)
    sched.submit(small, 0.0)
    sched.submit(big, 0.0)
    assert [t.id for t in drain(sched, blocker, 0.0)] == ["big", "small"]


# ---------------------------------------------------------------------------- oracle


def test_oracle_orders_by_true_output_not_prediction(
    make_spec: SpecFactory, make_lane: LaneFactory, make_ticket: TicketFactory
) -> None:
    """oracle: shortest *true* output first, even when the prediction says the opposite."""
    sched = Scheduler(make_spec(make_lane(policy="oracle")))
    blocker = start(sched, make_ticket("blocker"), 0.0)
    jobs = [("a", 10, 900), ("b", 900, 10), ("c", 400, 400), ("d", 50, 600)]
    for name, predicted, true in jobs:
        sched.submit(make_ticket(name, predicted=predicted, true_output=true, max_tokens=900), 0.0)
    assert [t.id for t in drain(sched, blocker, 0.0)] == ["b", "c", "d", "a"]


# ---------------------------------------------------------------------------- fair


def weighted_cost(ticket: Ticket, weight: float) -> float:
    """VTC cost of a served ticket: (1·prompt + 2·output) / weight."""
    return (ticket.prompt_tokens + 2 * output_of(ticket)) / weight


REQUEST = st.tuples(
    st.integers(1, 300), st.integers(1, 150), st.integers(1, 150), st.integers(0, 5)
)


FAIR_LANES = [{"policy": "fair"}] + [
    {"policy": ordering, "fairness": "vtc"} for ordering in sorted(ORDERINGS)
]
"""``policy: fair`` (slack ordering) and ``vtc`` fairness with every registered ordering."""


def _lane_id(lane: dict[str, str]) -> str:
    return "+".join(lane.values())


def served_order(
    sched: Scheduler, running: Ticket, weights: dict[str, float], queued: dict[str, int]
) -> tuple[list[Ticket], float]:
    """Complete the running ticket until the one-slot lane is empty; ``queued`` counts the
    tickets of tenants a and b waiting behind it.

    Returns the tickets in admission order and the largest gap between the two tenants'
    weighted served tokens at any completion while both were backlogged.
    """
    queued = dict(queued)
    served = {"a": 0.0, "b": 0.0}
    order: list[Ticket] = []
    gap = 0.0
    now = 0.0
    while True:
        now += 1.0
        usage = Usage(running.prompt_tokens, output_of(running))
        out = admits(sched.complete(running.id, usage, now))
        if running.tenant in served:
            served[running.tenant] += weighted_cost(running, weights[running.tenant])
        if not out:
            return order, gap
        (running,) = out
        order.append(running)
        queued[running.tenant] -= 1
        if queued["a"] and queued["b"]:
            gap = max(gap, abs(served["a"] - served["b"]))


@pytest.mark.parametrize("lane", FAIR_LANES, ids=_lane_id)
@pytest.mark.parametrize(("weight_a", "weight_b"), [(1.0, 1.0), (2.0, 1.0)])
@settings(max_examples=25, deadline=None)
@given(
    reqs_a=st.lists(REQUEST, min_size=5, max_size=30),
    reqs_b=st.lists(REQUEST, min_size=5, max_size=30),
)
def test_fair_keeps_backlogged_tenants_within_bound(
    lane: dict[str, str],
    weight_a: float,
    weight_b: float,
    reqs_a: list[tuple[int, int, int, int]],
    reqs_b: list[tuple[int, int, int, int]],
    make_spec: SpecFactory,
    make_lane: LaneFactory,
    make_ticket: TicketFactory,
) -> None:
    """vtc fairness, whatever the ordering: while two tenants are both backlogged, their
    weighted served tokens differ by at most twice the largest request's weighted cost (VTC
    bound), at every completion; and each tenant's tickets are admitted in exactly the order
    the same ordering gives them in a lane without fairness.

    Requests are (prompt, true output, predicted output, priority); the counter is
    charged the prediction at admission and corrected to the truth at finish.
    """
    weights = {"a": weight_a, "b": weight_b}
    tenants = [TenantSpec(name=name, weight=w) for name, w in weights.items()]
    tickets = {
        tenant: [
            make_ticket(
                f"{tenant}{i}",
                tenant=tenant,
                prompt_tokens=prompt,
                true_output=true,
                predicted=predicted,
                max_tokens=150,
                priority=priority,
                arrival=float(i % 4),
            )
            for i, (prompt, true, predicted, priority) in enumerate(reqs)
        ]
        for tenant, reqs in (("a", reqs_a), ("b", reqs_b))
    }
    costs = [weighted_cost(t, weights[t.tenant]) for group in tickets.values() for t in group]

    sched = Scheduler(make_spec(make_lane(**lane), tenants=tenants))
    blocker = start(sched, make_ticket("blocker", tenant="z", predicted=1), 0.0)
    for group in tickets.values():
        for ticket in group:
            sched.submit(ticket, 0.0)
    queued = {tenant: len(group) for tenant, group in tickets.items()}
    order, gap = served_order(sched, blocker, weights, queued)
    assert gap <= 2.0 * max(costs)

    ordering = lane["policy"] if lane["policy"] in ORDERINGS.names() else "slack"
    for tenant, group in tickets.items():
        alone = Scheduler(make_spec(make_lane(policy=ordering, fairness="none")))
        running = start(alone, make_ticket("blocker", tenant="z", predicted=1), 0.0)
        for ticket in group:
            alone.submit(ticket, 0.0)
        expected = drain(alone, running, 0.0)
        assert [t for t in order if t.tenant == tenant] == expected


FAIR_PROMPT = 100
FAIR_OUTPUT = 50


def fair_with_returning_tenant(
    make_spec: SpecFactory, make_lane: LaneFactory, make_ticket: TicketFactory
) -> tuple[Scheduler, Ticket, float]:
    """Tenant a is served alone for a while; then tenant b, idle so far, submits 5 tickets.

    Returns the scheduler, the running ticket and the time.
    """
    sched = Scheduler(make_spec(make_lane(policy="fair")))
    running = start(sched, make_ticket("blocker", tenant="z", predicted=1), 0.0)

    def job(name: str, tenant: str) -> Ticket:
        return make_ticket(
            name, tenant=tenant, prompt_tokens=FAIR_PROMPT, predicted=FAIR_OUTPUT, max_tokens=100
        )

    for i in range(10):
        sched.submit(job(f"a{i}", "a"), 0.0)
    now = 0.0
    for _ in range(6):
        now += 1.0
        (running,) = admits(sched.complete(running.id, Usage(FAIR_PROMPT, FAIR_OUTPUT), now))
    assert running.tenant == "a"
    for i in range(5):
        sched.submit(job(f"b{i}", "b"), now)
    return sched, running, now


def test_fair_returning_tenant_is_lifted_to_backlogged_minimum(
    make_spec: SpecFactory, make_lane: LaneFactory, make_ticket: TicketFactory
) -> None:
    """fair: a tenant that becomes backlogged has its counter lifted to the smallest
    backlogged counter, so idle time banks no credit."""
    sched, _, _ = fair_with_returning_tenant(make_spec, make_lane, make_ticket)
    counter_a = sched.counter(MODEL, LANE, "a")
    counter_b = sched.counter(MODEL, LANE, "b")
    assert counter_a is not None
    assert counter_a > 0.0
    assert counter_b == counter_a


def test_fair_returning_tenant_gets_no_burst(
    make_spec: SpecFactory, make_lane: LaneFactory, make_ticket: TicketFactory
) -> None:
    """fair: after an idle tenant returns with equal-size requests, the two alternate —
    the returning tenant does not monopolise the lane to catch up. (Which of the two goes
    first is a tie between equal counters; the test does not pin it.)"""
    sched, running, now = fair_with_returning_tenant(make_spec, make_lane, make_ticket)
    tenants: list[str] = []
    for _ in range(4):
        now += 1.0
        (running,) = admits(sched.complete(running.id, Usage(FAIR_PROMPT, FAIR_OUTPUT), now))
        tenants.append(running.tenant)
    first, second = tenants[:2]
    assert {first, second} == {"a", "b"}, tenants
    assert tenants == [first, second, first, second]


def test_fair_counter_is_none_outside_fair_lanes(
    make_spec: SpecFactory, make_lane: LaneFactory, make_ticket: TicketFactory
) -> None:
    """Scheduler.counter reports a fair-share counter only in lanes with ``vtc`` fairness
    (``policy: fair``, or any ordering with ``fairness: vtc``)."""
    sched = Scheduler(make_spec(make_lane(policy="fifo")))
    assert sched.counter(MODEL, LANE, "a") is None
    sched = Scheduler(make_spec(make_lane(policy="fifo", fairness="vtc")))
    start(sched, make_ticket("a1", tenant="a", prompt_tokens=10, predicted=5), 0.0)
    assert sched.counter(MODEL, LANE, "a") == 10 + 2 * 5


def test_fair_is_slack_ordering_with_vtc_fairness(
    make_spec: SpecFactory, make_lane: LaneFactory, make_ticket: TicketFactory
) -> None:
    """``policy: fair`` and ``policy: slack, fairness: vtc`` admit the same workload in
    the same order, and that order differs from slack without fairness."""
    orders = []
    for lane in ({"policy": "fair"}, {"policy": "slack", "fairness": "vtc"}, {"policy": "slack"}):
        sched = Scheduler(make_spec(make_lane(**lane)))
        blocker = start(sched, make_ticket("blocker", tenant="z", predicted=1), 0.0)
        for i in range(6):
            # Tenant a's tickets are all more urgent than b's: slack alone serves a first.
            tenant, deadline = ("a", 10.0 + i) if i < 3 else ("b", 100.0 + i)
            ticket = make_ticket(f"{tenant}{i}", tenant=tenant, deadline=deadline, predicted=20)
            sched.submit(ticket, 0.0)
        orders.append([t.id for t in drain(sched, blocker, 0.0)])
    assert orders[0] == orders[1] == ["a0", "b3", "a1", "b4", "a2", "b5"]
    assert orders[2] == ["a0", "a1", "a2", "b3", "b4", "b5"]


def test_lane_policy_and_fairness_resolve_to_an_ordering_and_a_fairness(
    make_lane: LaneFactory,
) -> None:
    """A lane's queue is built from (ordering, fairness): ``policy`` names the ordering,
    ``fairness`` defaults to ``none``, and ``fair`` means slack with ``vtc``."""
    assert make_lane(policy="sjf").queue_policy == ("sjf", "none")
    assert make_lane(policy="sjf", fairness="vtc").queue_policy == ("sjf", "vtc")
    assert make_lane(policy="fifo", fairness="none").queue_policy == ("fifo", "none")
    assert make_lane(policy="fair").queue_policy == ("slack", "vtc")
    assert make_lane(policy="fair", fairness="vtc").queue_policy == ("slack", "vtc")


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"policy": "lottery"}, r"unknown policy 'lottery'; choose one of \['fair', 'fifo'"),
        ({"fairness": "drr"}, r"unknown fairness 'drr'; choose one of \['none', 'vtc'\]"),
        ({"policy": "fair", "fairness": "none"}, r"policy 'fair' is 'slack' ordering with 'vtc'"),
    ],
)
def test_lane_refuses_unknown_or_contradictory_queue_policy(
    make_lane: LaneFactory, fields: dict[str, str], message: str
) -> None:
    """Unknown names are refused with the choices; ``fair`` with another fairness is a
    contradiction, refused with what to write instead."""
    with pytest.raises(ValidationError, match=message):
        make_lane(**fields)
