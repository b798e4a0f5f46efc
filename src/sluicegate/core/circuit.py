"""Passive health of one backend: a circuit breaker fed by request outcomes."""

from __future__ import annotations

import enum


class CircuitState(enum.Enum):
    """Closed: traffic flows. Open: none until the cool-down ends. Half-open: one probe."""

    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"


class CircuitBreaker:
    """Opens after ``failures`` consecutive failures for ``cooldown_s``, then lets one probe.

    A success while half-open closes it; a failure re-opens it for another
    cool-down. Every call takes ``now``; nothing here reads a clock.
    """

    __slots__ = ("_consecutive", "_cooldown_s", "_failures", "_opened_at", "_probing", "state")

    def __init__(self, *, failures: int, cooldown_s: float) -> None:
        if failures < 1:
            raise ValueError(f"failures must be >= 1, got {failures}")
        if cooldown_s <= 0:
            raise ValueError(f"cooldown_s must be > 0, got {cooldown_s}")
        self._failures = failures
        self._cooldown_s = cooldown_s
        self._consecutive = 0
        self._opened_at = 0.0
        self._probing = False
        self.state = CircuitState.CLOSED

    def state_at(self, now: float) -> CircuitState:
        """The state at ``now``: an open circuit whose cool-down has ended reads half-open.

        Reading never changes the circuit; transitions happen in ``advance`` and the
        ``on_*`` events.
        """
        if self.state is CircuitState.OPEN and now >= self._opened_at + self._cooldown_s:
            return CircuitState.HALF_OPEN
        return self.state

    def allows(self, now: float) -> bool:
        """Whether a new request may be sent now: closed, or half-open with no probe out."""
        if self.state is CircuitState.CLOSED:
            return True
        state = self.state_at(now)
        # An open circuit past its cool-down has no probe out yet, whatever _probing held.
        return state is CircuitState.HALF_OPEN and (
            self.state is CircuitState.OPEN or not self._probing
        )

    def advance(self, now: float) -> None:
        """Move open → half-open once the cool-down has ended."""
        if self.state is CircuitState.OPEN and now >= self._opened_at + self._cooldown_s:
            self.state = CircuitState.HALF_OPEN
            self._probing = False

    def on_dispatch(self, now: float) -> None:
        """A request was sent; while half-open it is the single probe."""
        self.advance(now)
        if self.state is CircuitState.HALF_OPEN:
            self._probing = True

    def on_success(self) -> None:
        """A request succeeded: the circuit closes."""
        self._consecutive = 0
        self._probing = False
        self.state = CircuitState.CLOSED

    def on_failure(self, now: float) -> None:
        """A request failed; enough of them in a row (or a failed probe) open the circuit."""
        self._consecutive += 1
        if self.state is CircuitState.HALF_OPEN or self._consecutive >= self._failures:
            self.trip(now)

    def on_unknown(self) -> None:
        """A request ended telling nothing of the backend (the gateway's own fault): the
        circuit stays as it is, but a half-open probe it was gives its turn back."""
        self._probing = False

    def trip(self, now: float) -> None:
        """Open the circuit now: enough failures, or the backend refused a connection."""
        self.state = CircuitState.OPEN
        self._opened_at = now
        self._probing = False

    def reopen_at(self) -> float | None:
        """When an open circuit will let a probe through; ``None`` unless open."""
        if self.state is CircuitState.OPEN:
            return self._opened_at + self._cooldown_s
        return None
