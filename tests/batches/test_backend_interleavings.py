"""Random interleavings of runners against each backend (Hypothesis, stateful).

Two or three owners claim, answer, send back and renew the lines of one batch
while time moves (leases run out) and the batch may be cancelled or expire. A
model predicts what each call must do; at every step no line has two results,
and once the batch ends its files hold every line exactly once.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import orjson
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from sluicegate.batches.batch_backend import BatchBackend, Claim, Retry
from tests.batches.conftest import (
    BACKENDS,
    LEASE_S,
    NOW,
    answer,
    content,
    line,
    make_backend,
    new_batch,
    read,
)

T = TypeVar("T")
WINDOW_S = 150
OWNERS = ("A", "B", "C")


@dataclass
class _Line:
    """What the model knows of one line."""

    custom_id: str
    result: bool | None = None
    owner: str | None = None
    lease_until: float = 0.0
    not_before: float = 0.0
    attempts: int = 0


@dataclass
class _Model:
    lines: list[_Line]
    status: str = "in_progress"
    held: dict[str, list[Claim]] = field(default_factory=lambda: {o: [] for o in OWNERS})

    def claimable(self, now: float) -> set[int]:
        if self.status != "in_progress":
            return set()
        return {
            idx
            for idx, one in enumerate(self.lines)
            if one.result is None
            and (one.owner is None or one.lease_until < now)
            and one.not_before <= now
        }


class BackendMachine(RuleBasedStateMachine):
    """One batch of 1–4 lines under random claims, answers, retries, renewals and time."""

    make: Callable[[], BatchBackend]

    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.backend = self.make()
        self.now = float(NOW)
        self.model = _Model([])
        self.batch_id = ""
        self.ended: str | None = None

    def run(self, call: Coroutine[Any, Any, T]) -> T:
        return self.loop.run_until_complete(call)

    @initialize(size=st.integers(1, 4))
    def start(self, size: int) -> None:
        self.run(self.backend.open())
        custom_ids = [f"c{i}" for i in range(size)]
        self.batch_id = self.run(
            new_batch(self.backend, [line(c) for c in custom_ids], window_s=WINDOW_S)
        )
        assert self.run(self.backend.validate_pending(read, NOW)) == [
            (self.batch_id, "in_progress")
        ]
        self.model.lines = [_Line(c) for c in custom_ids]

    @rule(
        owner=st.sampled_from(OWNERS),
        limit=st.integers(1, 3),
        later=st.sampled_from([0.0, 0.0, 1.0, 10.0, LEASE_S + 1, 90.0]),
    )
    def claim(self, owner: str, limit: int, later: float) -> None:
        """Time passes (leases and waits run out, the batch may come due); then a claim takes
        only claimable lines, as many as it may, with their attempts."""
        self.now += later
        claimable = self.model.claimable(self.now)
        claims = self.run(self.backend.claim("m1", owner, limit, self.now, LEASE_S))
        taken = [c.idx for c in claims]
        assert len(set(taken)) == len(taken)
        assert set(taken) <= claimable
        assert len(taken) == min(limit, len(claimable))
        for claim in claims:
            one = self.model.lines[claim.idx]
            assert claim.custom_id == one.custom_id
            assert claim.attempts == one.attempts
            one.owner, one.lease_until = owner, self.now + LEASE_S
            self.model.held[owner].append(claim)

    def take_held(self, pick: int) -> tuple[str, Claim]:
        held = [(owner, claim) for owner in OWNERS for claim in self.model.held[owner]]
        owner, claim = held[pick % len(held)]
        self.model.held[owner].remove(claim)
        return owner, claim

    def holding(self) -> bool:
        return any(self.model.held.values())

    @precondition(holding)
    @rule(pick=st.integers(0, 20), ok=st.booleans())
    def record_answer(self, pick: int, ok: bool) -> None:
        """A result is kept only if the line has none yet and its batch has not ended."""
        owner, claim = self.take_held(pick)
        self.run(self.backend.record([answer(claim, ok)], [], owner))
        one = self.model.lines[claim.idx]
        if one.result is None and self.model.status in ("in_progress", "cancelling"):
            one.result, one.owner = ok, None

    @precondition(holding)
    @rule(pick=st.integers(0, 20), failed=st.booleans(), wait=st.sampled_from([0.0, 5.0, 50.0]))
    def send_back(self, pick: int, failed: bool, wait: float) -> None:
        """A retry moves a line its owner still holds back to wait until ``not_before``."""
        owner, claim = self.take_held(pick)
        self.run(self.backend.record([], [Retry(claim, self.now + wait, failed)], owner))
        one = self.model.lines[claim.idx]
        if one.result is None and one.owner == owner:
            one.owner, one.not_before = None, self.now + wait
            one.attempts += int(failed)

    @rule(owner=st.sampled_from(OWNERS))
    def renew(self, owner: str) -> None:
        """Renewing extends the leases of the lines the owner still holds."""
        held = self.model.held[owner]
        if not held:
            return
        self.run(self.backend.renew(owner, held, self.now + LEASE_S))
        for one in self.model.lines:
            if one.owner == owner and one.result is None:
                one.lease_until = self.now + LEASE_S

    @rule(roll=st.integers(0, 3))
    def cancel(self, roll: int) -> None:
        """A cancel (drawn one time in four, so most batches run) stops an unfinished batch at
        its next ending."""
        if roll:
            return
        self.run(self.backend.cancel_batch("t1", self.batch_id, int(self.now)))
        if self.model.status == "in_progress":
            self.model.status = "cancelling"

    @rule()
    def finish(self) -> None:
        """``finish_due`` ends the batch exactly when the model says it is due."""
        ended = self.run(self.backend.finish_due(int(self.now)))
        status = self.model.status
        due = None
        if status == "cancelling":
            due = "cancelled"
        elif status == "in_progress" and all(o.result is not None for o in self.model.lines):
            due = "completed"
        elif status == "in_progress" and int(self.now) >= NOW + WINDOW_S:
            due = "expired"
        assert ended == ([] if due is None else [(self.batch_id, due)])
        if due is not None:
            self.model.status = self.ended = due
            self.check_files()

    def check_files(self) -> None:
        row = self.run(self.backend.get_batch("t1", self.batch_id))
        assert row is not None
        assert row["status"] == self.ended
        output = [] if row["output_file_id"] is None else self.file(row["output_file_id"])
        errors = [] if row["error_file_id"] is None else self.file(row["error_file_id"])
        lines = self.model.lines
        assert [o["custom_id"] for o in output] == [o.custom_id for o in lines if o.result]
        assert [e["custom_id"] for e in errors] == [o.custom_id for o in lines if not o.result]
        for entry in errors:
            one = lines[int(entry["custom_id"][1:])]
            if one.result is None:
                assert entry["error"]["code"] == f"batch_{self.ended}"
            else:
                assert entry == {"custom_id": one.custom_id, "ok": False}

    def file(self, file_id: str) -> list[dict[str, Any]]:
        return [orjson.loads(text) for text in self.run(content(self.backend, file_id))]

    @invariant()
    def one_result_per_line(self) -> None:
        """The backend's counts are the model's: no line has two results, none is lost."""
        if not self.batch_id:
            return
        counts = self.run(self.backend.batch_counts(self.batch_id))
        results = [o.result for o in self.model.lines]
        if self.ended is None:
            assert counts.completed == results.count(True)
            assert counts.failed == results.count(False)
        else:
            assert counts.completed == results.count(True)
            assert counts.completed + counts.failed == len(results)

    def teardown(self) -> None:
        try:
            self.run(self.backend.close())
        finally:
            self.loop.close()


@pytest.mark.parametrize("kind", BACKENDS)
def test_random_interleavings_keep_one_result_per_line(
    kind: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """Under any interleaving of claims by several owners, answers, retries, renewals, lease
    expiry, cancel and endings, each backend does what the model predicts."""
    if kind == "redis":
        request.getfixturevalue("redis_server")

    class Machine(BackendMachine):
        def make(self) -> BatchBackend:  # type: ignore[override]
            return make_backend(kind, tmp_path, request)

    run_state_machine_as_test(
        Machine,
        settings=settings(
            max_examples=80,
            stateful_step_count=50,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow],
        ),
    )
