"""The rate limit is checked without charging and charged once, in ``Scheduler.submit``.

``intake.refuse_early`` only asks whether the tenant's buckets would allow the request
(``TenantRateLimiter.wait_time``); ``submit`` charges them once, after the refusals that
follow (full queue, a lane closed by cluster pressure, a hopeless deadline): the request
counts against ``requests_per_s`` either way, its tokens only when it queues or runs.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from sluicegate.core.decisions import ErrorCode, Reject
from sluicegate.core.intake import refuse_early
from sluicegate.core.ratelimit import TenantRateLimiter
from sluicegate.core.runtime import ModelRuntime
from sluicegate.core.scheduler import Scheduler
from sluicegate.core.spec import LaneSpec, SchedulerSpec, TenantSpec
from sluicegate.core.ticket import Ticket

# 3 requests, then one per 1000 s; 1000 tokens, then one per second.
TENANT = TenantSpec(
    name="t", requests_per_s=0.001, burst_requests=3, tokens_per_min=60, burst_tokens=1000
)


def test_limiter_wait_time_charges_nothing() -> None:
    """``wait_time`` answers what ``try_acquire`` would, taking nothing; ``charge`` takes."""
    limiter = TenantRateLimiter([TENANT])
    assert [limiter.wait_time("t", 1000, 0.0) for _ in range(5)] == [0.0] * 5
    limiter.charge("t", 600, 0.0)
    assert limiter.wait_time("t", 400, 0.0) == 0.0
    assert limiter.wait_time("t", 401, 0.0) == pytest.approx(1.0)
    limiter.charge("t", 0, 0.0)
    limiter.charge("t", 0, 0.0)  # the third request of the burst
    assert limiter.wait_time("t", 0, 0.0) == pytest.approx(1000.0)


def test_refuse_early_charges_nothing(
    make_spec: Callable[..., SchedulerSpec], make_ticket: Callable[..., Ticket]
) -> None:
    """Asked again and again about a request its tenant's buckets allow once, it says yes
    each time: the check takes nothing from the buckets."""
    model = ModelRuntime(make_spec(tenants=[TENANT]).models[0], {})
    limiter = TenantRateLimiter([TENANT])
    ticket = make_ticket("a", prompt_tokens=500, max_tokens=500)
    for _ in range(3):
        assert refuse_early(model, ticket, 0.0, draining=False, closed=False, rate=limiter) is None
    assert limiter.try_acquire("t", 1000, 0.0) == 0.0
    refusal = refuse_early(model, ticket, 0.0, draining=False, closed=False, rate=limiter)
    assert isinstance(refusal, Reject)
    assert refusal.code is ErrorCode.RATE_LIMIT_EXCEEDED


@pytest.mark.parametrize(
    ("lane_fields", "pressure", "code"),
    [
        ({"max_queue": 0}, False, ErrorCode.QUEUE_FULL),
        ({"pressure_floor": 0}, True, ErrorCode.OVERLOADED),
        ({"shed_hopeless": True}, False, ErrorCode.OVERLOADED),
    ],
    ids=["queue_full", "pressure", "hopeless"],
)
def test_a_refusal_after_the_rate_check_counts_the_request_not_its_tokens(
    make_spec: Callable[..., SchedulerSpec],
    make_lane: Callable[..., LaneSpec],
    make_ticket: Callable[..., Ticket],
    lane_fields: dict[str, object],
    pressure: bool,
    code: ErrorCode,
) -> None:
    """Refused past the rate limit, a request has used one of its tenant's requests but
    none of its tokens (as before the charge moved, when its tokens were refunded)."""
    limiter = TenantRateLimiter([TENANT])
    sched = Scheduler(make_spec(make_lane(**lane_fields), tenants=[TENANT]), rate_limiter=limiter)
    sched.submit(make_ticket("run", prompt_tokens=100, max_tokens=200), 0.0)
    if pressure:
        sched.set_pressure(1, 0.0, retry_s=5.0)
    # 400 tokens at the 40 tok/s prior: 10 s of service, deadline in 5 s.
    late = make_ticket("late", prompt_tokens=100, max_tokens=400, predicted=400, deadline=5.0)
    (refusal,) = sched.submit(late, 0.0)
    assert isinstance(refusal, Reject)
    assert refusal.code is code
    assert sched.live_tickets() == 1
    # "run" took 300 tokens, "late" none; one request of three is left, then none.
    assert limiter.wait_time("t", 700, 0.0) == 0.0
    assert limiter.wait_time("t", 701, 0.0) == pytest.approx(1.0)
    assert limiter.try_acquire("t", 0, 0.0) == 0.0
    assert limiter.wait_time("t", 0, 0.0) == pytest.approx(1000.0)


def test_a_queued_request_is_charged_its_tokens_once(
    make_spec: Callable[..., SchedulerSpec],
    make_lane: Callable[..., LaneSpec],
    make_ticket: Callable[..., Ticket],
) -> None:
    """A request that queues is charged one request and prompt + max_tokens, once; when it
    ends unserved (cancelled from the queue) the tokens come back, the request does not."""
    limiter = TenantRateLimiter([TENANT])
    sched = Scheduler(make_spec(make_lane(), tenants=[TENANT]), rate_limiter=limiter)
    sched.submit(make_ticket("run", prompt_tokens=100, max_tokens=200), 0.0)
    sched.submit(make_ticket("queued", prompt_tokens=100, max_tokens=400), 0.0)
    assert limiter.wait_time("t", 200, 0.0) == 0.0
    assert limiter.wait_time("t", 201, 0.0) == pytest.approx(1.0)
    sched.cancel(make_ticket("queued").id, 0.0)
    assert limiter.wait_time("t", 700, 0.0) == 0.0
    assert limiter.wait_time("t", 701, 0.0) == pytest.approx(1.0)
    assert limiter.try_acquire("t", 0, 0.0) == 0.0
    assert limiter.wait_time("t", 0, 0.0) == pytest.approx(1000.0)
