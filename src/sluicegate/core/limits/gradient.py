"""Gradient2 limit: shrink when time to first token rises above its long-run level."""

from __future__ import annotations

import math
from typing import ClassVar

from sluicegate.core.limits.base import LIMITS
from sluicegate.core.spec import AdaptiveSpec

_DROP_RTT_FACTOR = 2.0
"""A dropped request counts as a sample this many times the long RTT."""

_DRIFT_RATIO = 2.0
_DRIFT_DECAY = 0.95
_GRADIENT_MIN = 0.5
_GRADIENT_MAX = 1.0


@LIMITS.register("latency")
class GradientLimit:
    """Netflix Gradient2 on time-to-first-token (TTFT) samples.

    Per sample ``short`` (the TTFT just observed) with float estimate ``L``:

    - ``long`` is an exponential average of samples with
      ``alpha = 2 / (long_window + 1)``; while fewer than ``1 / alpha`` samples
      have been seen it is their plain mean (weight ``max(alpha, 1/n)``), so a
      few early samples do not dominate it;
    - if ``long / short > 2`` the stored ``long`` is multiplied by 0.95 after
      use, so it recovers quickly once a burst of slow samples has passed;
    - if ``inflight < L / 2`` the limit is app-limited and does not move;
    - ``g = clamp(tolerance * long / short, 0.5, 1.0)``;
      ``new = L * g + sqrt(L)``; ``L = (1 - smoothing) * L + smoothing * new``,
      clamped to ``[floor, cap]``.

    The queue allowance ``sqrt(L)`` (as Gradient v1 and Envoy use) gives
    headroom that grows with the limit, so a large limit probes upward at a
    useful pace and a small one stays cautious; Gradient2's fixed default of 4
    is too coarse across caps from 2 to thousands.

    A ``dropped`` sample stands for a sample at twice the current long RTT
    (``g = clamp(tolerance / 2, ...)``, 0.75 by default): a drop says the
    backend is overloaded even if it never produced a TTFT. It does not feed
    the long average, and is ignored before any real sample has set one.
    Samples that are not positive and finite are ignored. KV-cache readings are
    ignored. ``value`` is ``int`` of the float estimate.
    """

    __slots__ = ("_alpha", "_cap", "_estimate", "_floor", "_long", "_seen", "_spec")

    name: ClassVar[str] = "latency"

    def __init__(self, spec: AdaptiveSpec, cap: int) -> None:
        if cap < spec.floor:
            raise ValueError(f"cap must be >= floor ({spec.floor}), got {cap}")
        self._spec = spec
        self._floor = float(spec.floor)
        self._cap = float(cap)
        self._estimate = float(cap)
        self._alpha = 2.0 / (spec.long_window + 1)
        self._long = 0.0
        self._seen = 0

    @property
    def value(self) -> int:
        """The current effective limit, in ``[spec.floor, cap]``."""
        return int(self._estimate)

    @property
    def long_rtt_s(self) -> float | None:
        """The long-run TTFT estimate, or ``None`` before the first sample."""
        return self._long if self._seen else None

    def on_sample(self, *, rtt_s: float, inflight: int, dropped: bool) -> None:
        """Move the limit from one TTFT sample taken with ``inflight`` running."""
        if dropped:
            if not self._seen:
                return
            long = self._long
            short = long * _DROP_RTT_FACTOR
        else:
            if not (0.0 < rtt_s < math.inf):
                return
            short = rtt_s
            long = self._update_long(short)
        self._adjust(long, short, inflight)

    def on_kv_usage(self, usage: float, *, inflight: int) -> None:
        """Ignored: this mode reacts to latency samples only."""

    def _update_long(self, short: float) -> float:
        """Fold ``short`` into the long average; return the value to use for this sample."""
        if self._seen * self._alpha < 1.0:
            self._seen += 1
            weight = max(self._alpha, 1.0 / self._seen)
        else:
            weight = self._alpha
        long = self._long + weight * (short - self._long)
        self._long = long * _DRIFT_DECAY if long > _DRIFT_RATIO * short else long
        return long

    def _adjust(self, long: float, short: float, inflight: int) -> None:
        estimate = self._estimate
        if inflight < estimate / 2.0:
            return
        spec = self._spec
        gradient = min(_GRADIENT_MAX, max(_GRADIENT_MIN, spec.tolerance * long / short))
        target = estimate * gradient + math.sqrt(estimate)
        smoothed = (1.0 - spec.smoothing) * estimate + spec.smoothing * target
        self._estimate = min(self._cap, max(self._floor, smoothed))
