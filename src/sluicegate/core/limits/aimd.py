"""AIMD limit: additive increase under load, multiplicative decrease on drops."""

from __future__ import annotations

from typing import ClassVar

from sluicegate.core.limits.limit import Limit, SampleKind, multiplicative_decrease


class AimdLimit(Limit):
    """Additive-increase / multiplicative-decrease on finished requests.

    For each finished request with limit ``L``:

    - dropped (the engine failed, timed out or answered 429/503), or a
      time-to-first-token sample above ``timeout_s``:
      ``L = max(floor, min(L - 1, floor(L * decrease)))`` — ``decrease`` is
      0.9 by default, and a drop always costs at least one slot;
    - else if ``inflight * 2 >= L``: ``L = min(cap, L + increase)``;
    - else (app-limited) ``L`` is unchanged.

    Drops count whatever the load. ``timeout_s`` judges first-token samples
    only: a per-output-token sample of a unary answer is a success (a unary
    answer too slow to bear is cut by the gateway's upstream timeout, which
    is a drop). KV-cache readings are ignored.
    """

    __slots__ = ()

    name: ClassVar[str] = "aimd"

    def on_success(self, rtt_s: float, *, inflight: int, kind: SampleKind) -> None:
        """A slow first token is a drop; any other answer under load adds ``increase``."""
        if kind is SampleKind.FIRST_TOKEN and rtt_s > self.spec.timeout_s:
            self._decrease()
        elif inflight * 2 >= self.value:
            self.update(self.value + self.spec.increase)

    def on_dropped(self, *, inflight: int) -> None:
        """Multiply by ``decrease``, at least one slot down."""
        self._decrease()

    def _decrease(self) -> None:
        self.update(multiplicative_decrease(self.value, self.spec.decrease))
