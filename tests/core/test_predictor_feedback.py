"""The predictor learns output lengths only from answers the engine gave in full."""

from __future__ import annotations

import pytest

from sluicegate.core.decisions import Admit, Reject
from sluicegate.core.scheduler import Scheduler
from sluicegate.core.ticket import Feedback, Usage
from tests.core.conftest import build_lane, build_spec, build_ticket


def _retry_after_queue_full(feedback: Feedback | None) -> float:
    """Run one 4000-token request ending with ``feedback`` (``None``: nothing ran), then
    the drain estimate a queue-full refusal carries: it scales with the predicted
    service time, which learned output lengths move."""
    sched = Scheduler(build_spec(build_lane(max_concurrency=1, max_queue=0)))
    if feedback is not None:
        (admit,) = sched.submit(build_ticket("a", max_tokens=4096), 0.0)
        assert isinstance(admit, Admit)
        sched.complete(admit.ticket.id, Usage(100, 4000, feedback=feedback), 1.0)
    (holder,) = sched.submit(build_ticket("b", max_tokens=4096, arrival=2.0), 2.0)
    assert isinstance(holder, Admit)
    (refusal,) = sched.submit(build_ticket("c", max_tokens=4096, arrival=2.0), 2.0)
    assert isinstance(refusal, Reject)
    return refusal.retry_after_s


@pytest.mark.parametrize("feedback", [Feedback.IGNORE, Feedback.DROP])
def test_requests_that_were_not_answered_in_full_teach_nothing(feedback: Feedback) -> None:
    """A client's 4xx or disconnect (IGNORE) or an engine failure (DROP) with 4000
    counted tokens leaves the prediction where it was with no request at all, while a
    full answer (SAMPLE) with the same counts moves it."""
    untaught = _retry_after_queue_full(None)
    assert _retry_after_queue_full(feedback) == untaught
    assert _retry_after_queue_full(Feedback.SAMPLE) != untaught
