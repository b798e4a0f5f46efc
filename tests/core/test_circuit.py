"""Passive-health circuit breaker (core/circuit.py): closed → open → half-open → closed."""

from __future__ import annotations

import pytest

from sluicegate.core.circuit import CircuitBreaker, CircuitState

FAILURES = 3
COOLDOWN_S = 10.0


def opened_at(now: float) -> CircuitBreaker:
    """A breaker opened by FAILURES consecutive failures at ``now``."""
    breaker = CircuitBreaker(failures=FAILURES, cooldown_s=COOLDOWN_S)
    for _ in range(FAILURES):
        breaker.on_failure(now)
    return breaker


def test_stays_closed_below_threshold() -> None:
    """Fewer than N consecutive failures leave the circuit closed and traffic flowing."""
    breaker = CircuitBreaker(failures=FAILURES, cooldown_s=COOLDOWN_S)
    for _ in range(FAILURES - 1):
        breaker.on_failure(0.0)
    assert breaker.state is CircuitState.CLOSED
    assert breaker.allows(0.0)


def test_opens_after_n_consecutive_failures() -> None:
    """The N-th consecutive failure opens the circuit: no traffic, reopen_at = now + cool-down."""
    breaker = opened_at(5.0)
    assert breaker.state is CircuitState.OPEN
    assert not breaker.allows(5.0)
    assert breaker.reopen_at() == 5.0 + COOLDOWN_S


def test_success_resets_the_failure_count() -> None:
    """Failures must be consecutive: a success in between starts the count again."""
    breaker = CircuitBreaker(failures=FAILURES, cooldown_s=COOLDOWN_S)
    for _ in range(FAILURES - 1):
        breaker.on_failure(0.0)
    breaker.on_success()
    for _ in range(FAILURES - 1):
        breaker.on_failure(1.0)
    assert breaker.state is CircuitState.CLOSED


def test_stays_open_until_cooldown_ends() -> None:
    """An open circuit refuses traffic until exactly opened_at + cool-down."""
    breaker = opened_at(0.0)
    assert not breaker.allows(COOLDOWN_S - 1e-6)
    assert breaker.state_at(COOLDOWN_S - 1e-6) is CircuitState.OPEN
    assert breaker.allows(COOLDOWN_S)
    assert breaker.state_at(COOLDOWN_S) is CircuitState.HALF_OPEN


def test_reading_changes_nothing() -> None:
    """allows() and state_at() are pure: however often they are read past the cool-down,
    the stored state stays open and a probe is still allowed, until an event moves it."""
    breaker = opened_at(0.0)
    for _ in range(3):
        assert breaker.allows(COOLDOWN_S + 1.0)
        assert breaker.state_at(COOLDOWN_S + 1.0) is CircuitState.HALF_OPEN
    assert breaker.state is CircuitState.OPEN
    breaker.advance(COOLDOWN_S - 1.0)
    assert breaker.state is CircuitState.OPEN
    breaker.advance(COOLDOWN_S)
    assert breaker.state is CircuitState.HALF_OPEN
    assert breaker.allows(COOLDOWN_S)


def test_half_open_allows_exactly_one_probe() -> None:
    """After the cool-down, one request may go through; the next waits for its outcome."""
    breaker = opened_at(0.0)
    assert breaker.allows(COOLDOWN_S)
    breaker.on_dispatch(COOLDOWN_S)
    assert not breaker.allows(COOLDOWN_S)
    assert not breaker.allows(COOLDOWN_S + 5.0)


def test_probe_success_closes() -> None:
    """A successful probe closes the circuit: traffic flows freely again."""
    breaker = opened_at(0.0)
    assert breaker.allows(COOLDOWN_S)
    breaker.on_dispatch(COOLDOWN_S)
    breaker.on_success()
    assert breaker.state is CircuitState.CLOSED
    assert breaker.reopen_at() is None
    for _ in range(3):
        breaker.on_dispatch(COOLDOWN_S)
        assert breaker.allows(COOLDOWN_S)


def test_probe_failure_reopens_for_another_cooldown() -> None:
    """A failed probe re-opens the circuit at once, for a fresh cool-down from the failure."""
    breaker = opened_at(0.0)
    assert breaker.allows(COOLDOWN_S)
    breaker.on_dispatch(COOLDOWN_S)
    breaker.on_failure(12.0)
    assert breaker.state is CircuitState.OPEN
    assert not breaker.allows(12.0 + COOLDOWN_S - 1e-6)
    assert breaker.reopen_at() == 12.0 + COOLDOWN_S


def test_trip_opens_immediately() -> None:
    """trip() (an active probe found the backend down) opens a closed circuit at once."""
    breaker = CircuitBreaker(failures=FAILURES, cooldown_s=COOLDOWN_S)
    breaker.trip(3.0)
    assert breaker.state is CircuitState.OPEN
    assert not breaker.allows(3.0)


@pytest.mark.parametrize(("failures", "cooldown_s"), [(0, 1.0), (1, 0.0), (1, -1.0)])
def test_rejects_invalid_settings(failures: int, cooldown_s: float) -> None:
    """failures must be ≥ 1 and cooldown_s > 0."""
    with pytest.raises(ValueError, match="must be"):
        CircuitBreaker(failures=failures, cooldown_s=cooldown_s)
