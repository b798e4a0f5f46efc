"""A minimal virtual-clock driver for engine tests (what the simulator does, in small)."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from sluicegate.engine import Engine, StepResult


@dataclass(frozen=True)
class Arrival:
    """One request to feed the engine at time ``at``."""

    at: float
    req_id: str
    prompt_tokens: int
    max_tokens: int
    output_tokens: int | None = None
    ignore_eos: bool = False


@dataclass
class Trace:
    """Every step the driver ran: ``(start time, result)``."""

    steps: list[tuple[float, StepResult]] = field(default_factory=list)

    def end_of(self, index: int) -> float:
        start, result = self.steps[index]
        return start + result.duration_s

    def finish_time(self, req_id: str) -> float:
        return next(s + r.duration_s for s, r in self.steps if req_id in r.finished)

    def token_times(self, req_id: str) -> list[float]:
        return [s + r.duration_s for s, r in self.steps if req_id in r.tokens]

    def tokens_of(self, req_id: str) -> int:
        return sum(r.tokens.get(req_id, 0) for _, r in self.steps)

    def results(self) -> list[StepResult]:
        return [r for _, r in self.steps]


def drive(
    engine: Engine,
    arrivals: Iterable[Arrival],
    *,
    check: Callable[[Engine, StepResult], None] | None = None,
    max_steps: int = 200_000,
) -> Trace:
    """Run the engine to idle; arrivals join at the first step boundary at or after ``at``."""
    pending = deque(sorted(arrivals, key=lambda a: a.at))
    trace = Trace()
    now = 0.0
    for _ in range(max_steps):
        while pending and pending[0].at <= now:
            a = pending.popleft()
            engine.add_request(
                a.req_id, a.prompt_tokens, a.max_tokens, a.at,
                output_tokens=a.output_tokens, ignore_eos=a.ignore_eos,
            )  # fmt: skip
        result = engine.step(now)
        if result is None:
            if not pending:
                return trace
            now = pending[0].at
            continue
        trace.steps.append((now, result))
        if check is not None:
            check(engine, result)
        now += result.duration_s
    raise AssertionError(f"engine did not go idle within {max_steps} steps")
