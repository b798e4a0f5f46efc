"""Gradient2 limit: shrink when request latency rises above its long-run level."""

from __future__ import annotations

import math
from typing import ClassVar

from sluicegate.core.component_specs import AdaptiveSpec
from sluicegate.core.limits.limit import Limit, SampleKind

_DRIFT_RATIO = 2.0
_DRIFT_DECAY = 0.95
_GRADIENT_MIN = 0.5
_GRADIENT_MAX = 1.0


class _LongRtt:
    """The long-run level of one kind of latency sample."""

    __slots__ = ("_alpha", "seen", "value")

    def __init__(self, alpha: float) -> None:
        self._alpha = alpha
        self.seen = 0
        self.value = 0.0

    def update(self, short: float) -> float:
        """Fold ``short`` in; return the long value to compare this sample with."""
        if self.seen * self._alpha < 1.0:
            self.seen += 1
            weight = max(self._alpha, 1.0 / self.seen)
        else:
            weight = self._alpha
        long = self.value + weight * (short - self.value)
        self.value = long * _DRIFT_DECAY if long > _DRIFT_RATIO * short else long
        return long


class GradientLimit(Limit):
    """Netflix Gradient2 on latency samples, with a separate history per sample kind.

    Per sample ``short`` of kind ``k`` (``SampleKind``: time to first token,
    or a unary answer's time per output token) with float estimate ``L``:

    - ``long`` is an exponential average of the samples of kind ``k`` with
      ``alpha = 2 / (long_window + 1)``; while fewer than ``1 / alpha`` samples
      have been seen it is their plain mean (weight ``max(alpha, 1/n)``), so a
      few early samples do not dominate it;
    - if ``long / short > 2`` the stored ``long`` is multiplied by 0.95 after
      use, so it recovers quickly once a burst of slow samples has passed;
    - if ``inflight < L / 2`` the limit is app-limited and does not move;
    - ``g = clamp(tolerance * long / short, 0.5, 1.0)``;
      ``new = L * g + sqrt(L)``; ``L = (1 - smoothing) * L + smoothing * new``,
      clamped to ``[floor, cap]``.

    Each kind is compared only with its own history: a model serving streams
    and unary requests would otherwise read every change in that mix as a
    change in latency.

    The queue allowance ``sqrt(L)`` (as Gradient v1 and Envoy use) gives
    headroom that grows with the limit, so a large limit probes upward at a
    useful pace and a small one stays cautious; Gradient2's fixed default of 4
    is too coarse across caps from 2 to thousands.

    A ``dropped`` request (the engine failed, timed out or answered 429/503)
    counts as the smallest gradient (0.5) without the queue allowance:
    ``L = L * (1 - smoothing / 2)`` (0.9 by default), whatever the load and
    even before any latency sample. A refused or failed request is direct
    evidence of overload, unlike latency at low load; and read as a slow
    sample instead, a drop could not lower a limit of 16 or less with the
    default tolerance (the queue allowance outweighs the gradient). A drop
    feeds no long average.

    Samples that are not positive and finite are ignored. KV-cache readings
    are ignored. ``value`` is ``int`` of the float estimate.
    """

    __slots__ = ("_long",)

    name: ClassVar[str] = "latency"

    def __init__(self, spec: AdaptiveSpec, cap: int) -> None:
        super().__init__(spec, cap)
        alpha = 2.0 / (spec.long_window + 1)
        self._long = {kind: _LongRtt(alpha) for kind in SampleKind}

    @property
    def long_rtt_s(self) -> float | None:
        """The long-run time to first token, or ``None`` before the first such sample."""
        return self.long_rtt_of(SampleKind.FIRST_TOKEN)

    def long_rtt_of(self, kind: SampleKind) -> float | None:
        """The long-run level of samples of ``kind``, or ``None`` before the first one."""
        long = self._long[kind]
        return long.value if long.seen else None

    def on_success(self, rtt_s: float, *, inflight: int, kind: SampleKind) -> None:
        """Fold the sample into its kind's long-run level and move the limit by the gradient."""
        if not (0.0 < rtt_s < math.inf):
            return
        long = self._long[kind].update(rtt_s)
        estimate = self.estimate
        if inflight < estimate / 2.0:
            return
        spec = self.spec
        gradient = min(_GRADIENT_MAX, max(_GRADIENT_MIN, spec.tolerance * long / rtt_s))
        target = estimate * gradient + math.sqrt(estimate)
        self.update((1.0 - spec.smoothing) * estimate + spec.smoothing * target)

    def on_dropped(self, *, inflight: int) -> None:
        """The smallest gradient without the queue allowance: ``L · (1 − smoothing / 2)``."""
        self.update(self.estimate * (1.0 - self.spec.smoothing * (1.0 - _GRADIENT_MIN)))
