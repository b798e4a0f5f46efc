"""AIMD limit: additive increase under load, multiplicative decrease on drops."""

from __future__ import annotations

import math
from typing import ClassVar

from sluicegate.core.limits.base import LIMITS, SampleKind
from sluicegate.core.spec import AdaptiveSpec


@LIMITS.register("aimd")
class AimdLimit:
    """Additive-increase / multiplicative-decrease on finished requests.

    For each finished request with limit ``L``:

    - ``dropped`` (the engine failed, timed out or answered 429/503), or a
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

    __slots__ = ("_cap", "_floor", "_spec", "_value")

    name: ClassVar[str] = "aimd"

    def __init__(self, spec: AdaptiveSpec, cap: int) -> None:
        if cap < spec.floor:
            raise ValueError(f"cap must be >= floor ({spec.floor}), got {cap}")
        self._spec = spec
        self._floor = spec.floor
        self._cap = cap
        self._value = cap

    @property
    def value(self) -> int:
        """The current effective limit, in ``[spec.floor, cap]``."""
        return self._value

    def on_sample(
        self,
        *,
        rtt_s: float,
        inflight: int,
        dropped: bool,
        kind: SampleKind = SampleKind.FIRST_TOKEN,
    ) -> None:
        """Move the limit from one finished request (see the class docstring)."""
        spec = self._spec
        current = self._value
        slow = kind is SampleKind.FIRST_TOKEN and rtt_s > spec.timeout_s
        if dropped or slow:
            # The epsilon keeps 0.29 * 100 at 29 rather than 28.999… → 28.
            lowered = min(current - 1, math.floor(current * spec.decrease + 1e-9))
            self._value = max(self._floor, lowered)
        elif inflight * 2 >= current:
            self._value = min(self._cap, current + spec.increase)

    def on_kv_usage(self, usage: float, *, inflight: int) -> None:
        """Ignored: this mode reacts to finished requests only."""
