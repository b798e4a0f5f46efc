"""KV-cache-pressure limit: back off when the engines' KV cache fills up."""

from __future__ import annotations

from typing import ClassVar

from sluicegate.core.limits.limit import Limit, multiplicative_decrease


class KvCacheLimit(Limit):
    """Multiplicative decrease on high KV usage, additive increase on low usage.

    For each usage reading ``u`` with limit ``L``:

    - ``u > high_water``: ``L = max(floor, floor(L * decrease))`` (always at
      least one less unless already at ``floor``);
    - ``u < low_water``: ``L = min(cap, L + increase)``;
    - otherwise ``L`` is unchanged (the hysteresis band).

    Finished requests (samples and drops alike) are ignored.
    """

    __slots__ = ()

    name: ClassVar[str] = "kv_cache"

    def on_kv_usage(self, usage: float, *, inflight: int) -> None:
        """Move the limit from one KV-cache usage reading in ``[0, 1]``."""
        spec = self.spec
        if usage > spec.high_water:
            self.update(multiplicative_decrease(self.value, spec.decrease))
        elif usage < spec.low_water:
            self.update(self.value + spec.increase)
