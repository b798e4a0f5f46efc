"""KV-cache-pressure limit: back off when the engines' KV cache fills up."""

from __future__ import annotations

import math
from typing import ClassVar

from sluicegate.core.limits.base import LIMITS, SampleKind
from sluicegate.core.spec import AdaptiveSpec


@LIMITS.register("kv_cache")
class KvCacheLimit:
    """Multiplicative decrease on high KV usage, additive increase on low usage.

    For each usage reading ``u`` with limit ``L``:

    - ``u > high_water``: ``L = max(floor, floor(L * decrease))`` (always at
      least one less unless already at ``floor``);
    - ``u < low_water``: ``L = min(cap, L + increase)``;
    - otherwise ``L`` is unchanged (the hysteresis band).

    Latency samples are ignored.
    """

    __slots__ = ("_cap", "_floor", "_spec", "_value")

    name: ClassVar[str] = "kv_cache"

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
        """Ignored, drops included: this mode reacts to KV-cache usage only."""

    def on_kv_usage(self, usage: float, *, inflight: int) -> None:
        """Move the limit from one KV-cache usage reading in ``[0, 1]``."""
        spec = self._spec
        current = self._value
        if usage > spec.high_water:
            # The epsilon keeps 0.29 * 100 at 29 rather than 28.999… → 28.
            lowered = min(current - 1, math.floor(current * spec.decrease + 1e-9))
            self._value = max(self._floor, lowered)
        elif usage < spec.low_water:
            self._value = min(self._cap, current + spec.increase)
