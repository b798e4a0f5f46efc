"""AIMD limit: additive increase under load, multiplicative decrease on drops."""

from __future__ import annotations

import math
from typing import ClassVar

from sluicegate.core.limits.base import LIMITS
from sluicegate.core.spec import AdaptiveSpec


@LIMITS.register("aimd")
class AimdLimit:
    """Additive-increase / multiplicative-decrease on latency samples.

    For each sample with limit ``L``:

    - ``dropped`` or ``rtt_s > timeout_s``: ``L = max(floor, floor(L * decrease))``;
    - else if ``inflight * 2 >= L``: ``L = min(cap, L + increase)``;
    - else (app-limited) ``L`` is unchanged.

    KV-cache readings are ignored.
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

    def on_sample(self, *, rtt_s: float, inflight: int, dropped: bool) -> None:
        """Move the limit from one time-to-first-token sample."""
        spec = self._spec
        current = self._value
        if dropped or rtt_s > spec.timeout_s:
            lowered = min(current - 1, math.floor(current * spec.decrease + 1e-9))
            self._value = max(self._floor, lowered)
        elif inflight * 2 >= current:
            self._value = min(self._cap, current + spec.increase)

    def on_kv_usage(self, usage: float, *, inflight: int) -> None:
        """Ignored: this mode reacts to latency samples only."""
