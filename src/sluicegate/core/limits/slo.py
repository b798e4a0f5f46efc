"""SLO limit: keep the running batch where time per output token and first token meet targets.

In a continuous-batching engine every running sequence shares each step, so
a step's length, and so every sequence's time per output token (TPOT), grows
with the batch (DESIGN §11). This mode sizes the model's running set from what
finished requests report: it lowers the limit when recent answers decode or
start slower than the targets, and raises it again while they meet them.
"""

from __future__ import annotations

import math
from typing import ClassVar

from sluicegate.core.component_specs import AdaptiveSpec
from sluicegate.core.limits.limit import Limit, SampleKind, multiplicative_decrease


def nearest_rank(samples: list[float], quantile: float) -> float:
    """The ``quantile`` of ``samples`` by the nearest-rank method (a sample, not an interpolation).

    ``samples`` must be non-empty; ``quantile`` in (0, 1].
    """
    ordered = sorted(samples)
    rank = max(1, math.ceil(quantile * len(ordered) - 1e-9))
    return ordered[rank - 1]


class SloLimit(Limit):
    """Quantile AIMD on time per output token and time to first token, one decision per window.

    Each answered request contributes its samples: a streamed answer (a
    first-token sample) its time to first token, measured from admission, and
    its time per output token after the first, ``(elapsed − ttft) / (tokens − 1)``;
    a unary answer that arrived in one piece its time per output token over the
    whole answer (``elapsed / tokens``, which includes the first token, so it
    over-states TPOT a little: the limit errs on the small side). Samples that
    are not finite and non-negative are left out. Every ``window`` answers the
    limit decides, from the samples of that window only, with limit ``L``:

    - a ``quantile`` of the window's TPOT samples above ``tpot_ms``, or of its
      TTFT samples above ``ttft_ms``: ``L = max(floor, min(L − 1, ⌊L · decrease⌋))``;
    - otherwise, if at least half the limit was in use (``2 · inflight ≥ L``
      for the busiest answer of the window): ``L = min(cap, L + increase)``;
    - otherwise (app-limited: the batch was not what the limit allowed) ``L``
      stays.

    Then the window starts afresh, so every decision judges only answers that
    ended after the previous one; no clock is read, the answers are the clock.
    A drop (the engine failed, timed out or refused for load) decreases at once
    and starts a fresh window. KV-cache readings are ignored: in-flight tokens
    are bounded by the token budget (DESIGN §5).

    The samples are not split by lane: all sequences of a batch share its step
    time, so a background request's TPOT measures the same batch an interactive
    one sees. TTFT from admission leaves out the gateway's own queue, which the
    limit causes rather than cures; it measures prefill and the engine's own
    waiting, which a smaller batch does shorten.

    Converges, on a TPOT that grows with the batch, to oscillate just below the
    largest batch whose TPOT meets the target: between about ``decrease`` times
    that batch and it plus ``increase``.
    """

    __slots__ = ("_answers", "_busiest", "_tpot_s", "_ttft_s")

    name: ClassVar[str] = "slo"

    def __init__(self, spec: AdaptiveSpec, cap: int) -> None:
        super().__init__(spec, cap)
        self._tpot_s: list[float] = []
        self._ttft_s: list[float] = []
        self._answers = 0
        self._busiest = 0

    def on_success(self, rtt_s: float, *, inflight: int, kind: SampleKind) -> None:
        """One sample without a separate TPOT: a first-token or a per-output-token sample."""
        self.on_answer(rtt_s, inflight=inflight, kind=kind, tpot_s=None)

    def on_answer(
        self, rtt_s: float, *, inflight: int, kind: SampleKind, tpot_s: float | None
    ) -> None:
        """Record the answer's samples; decide once ``window`` answers have come."""
        if kind is SampleKind.FIRST_TOKEN:
            _keep(self._ttft_s, rtt_s)
            if tpot_s is not None:
                _keep(self._tpot_s, tpot_s)
        else:
            _keep(self._tpot_s, rtt_s)
        self._answers += 1
        self._busiest = max(self._busiest, inflight)
        if self._answers >= self.spec.window:
            self._decide()

    def on_dropped(self, *, inflight: int) -> None:
        """Decrease at once, and judge the next window afresh."""
        self._decrease()
        self._reset()

    def _decide(self) -> None:
        quantile = self.spec.quantile
        slow = (
            bool(self._tpot_s) and nearest_rank(self._tpot_s, quantile) * 1e3 > self.spec.tpot_ms
        ) or (bool(self._ttft_s) and nearest_rank(self._ttft_s, quantile) * 1e3 > self.spec.ttft_ms)
        if slow:
            self._decrease()
        elif 2 * self._busiest >= self.value:
            self.update(self.value + self.spec.increase)
        self._reset()

    def _decrease(self) -> None:
        self.update(multiplicative_decrease(self.value, self.spec.decrease))

    def _reset(self) -> None:
        self._tpot_s.clear()
        self._ttft_s.clear()
        self._answers = 0
        self._busiest = 0


def _keep(samples: list[float], value: float) -> None:
    if math.isfinite(value) and value >= 0.0:
        samples.append(value)
