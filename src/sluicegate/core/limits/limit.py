"""The adaptive-limit seam: a concurrency limit in ``[floor, cap]`` moved by feedback.

The scheduler reports each finished request to its model's limit the way
Netflix's concurrency-limits reports to a ``Limiter.Listener``: exactly one of
``on_answer`` (a latency sample, and the time per output token when it can be
measured; by default passed on to ``on_success``), ``on_dropped`` or
``on_ignore`` (``core/limits/feedback.py`` decides which). KV-cache readings from the
engines arrive separately through ``on_kv_usage``.
"""

from __future__ import annotations

import enum
import math
from typing import ClassVar

from sluicegate.core.component_specs import AdaptiveSpec


class SampleKind(enum.Enum):
    """What a latency sample measures; a mode compares a sample only with its own kind.

    ``FIRST_TOKEN``: admission to the first generated token, seen when the
    engine streams to the gateway (streamed requests, and unary ones the
    gateway streams upstream and reassembles). ``PER_OUTPUT_TOKEN``: admission
    to the whole answer divided by its output tokens (at least one), for unary
    answers that arrive in one piece and so have no observable first token.
    The two differ by an order of magnitude, so mixing them in one history
    would read every switch of request kind as a latency change.
    """

    FIRST_TOKEN = "first_token"
    PER_OUTPUT_TOKEN = "per_output_token"


def multiplicative_decrease(value: int, factor: float) -> int:
    """``floor(value · factor)``, but always at least one less than ``value``.

    The epsilon keeps 0.29 · 100 at 29 rather than 28.999… → 28.
    """
    return min(value - 1, math.floor(value * factor + 1e-9))


class Limit:
    """A concurrency limit that never reads a clock: callers report every outcome.

    The base holds what every mode shares — the settings, the bounds and the
    current estimate — and keeps the estimate in ``[spec.floor, cap]``: a mode
    moves it only through ``update``, which clamps. A mode overrides the
    events it reacts to; the others are ignored.

    A base class rather than a Protocol because of that shared state and
    clamp: each mode then holds only its rule.

    Args:
        spec: The model's adaptive-limit settings.
        cap: The configured concurrency ceiling; the limit starts there.

    Raises:
        ValueError: ``cap`` is below ``spec.floor``.
    """

    __slots__ = ("_cap", "_estimate", "_floor", "spec")

    name: ClassVar[str]

    def __init__(self, spec: AdaptiveSpec, cap: int) -> None:
        if cap < spec.floor:
            raise ValueError(
                f"adaptive limit cap must be >= floor ({spec.floor}), got {cap}; "
                "raise max_concurrency or lower adaptive.floor"
            )
        self.spec = spec
        self._floor = float(spec.floor)
        self._cap = float(cap)
        self._estimate = float(cap)

    @property
    def value(self) -> int:
        """The current effective limit: an integer in ``[spec.floor, cap]``."""
        return int(self._estimate)

    @property
    def estimate(self) -> float:
        """The limit before rounding down (modes that move in fractions keep them here)."""
        return self._estimate

    def update(self, estimate: float) -> None:
        """Set the limit to ``estimate``, clamped into ``[spec.floor, cap]``."""
        self._estimate = min(self._cap, max(self._floor, estimate))

    def on_success(self, rtt_s: float, *, inflight: int, kind: SampleKind) -> None:
        """The engine answered: ``rtt_s`` is a latency sample of ``kind``.

        ``inflight`` counts the model's running requests when it ended, itself
        included. Ignored unless the mode overrides it.
        """

    def on_answer(
        self, rtt_s: float, *, inflight: int, kind: SampleKind, tpot_s: float | None
    ) -> None:
        """The engine answered: the one call ``report_outcome`` makes for a served request.

        ``rtt_s`` is the latency sample of ``kind``; ``tpot_s`` is the answer's
        time per output token after the first (``(elapsed − ttft) / (tokens − 1)``)
        when a first token was seen and at least two tokens came, else ``None``.
        The default passes the sample on to ``on_success``, so a mode that needs
        only one sample per answer overrides that instead.
        """
        self.on_success(rtt_s, inflight=inflight, kind=kind)

    def on_dropped(self, *, inflight: int) -> None:
        """The engine failed, timed out or refused the request for load.

        Ignored unless the mode overrides it.
        """

    def on_ignore(self) -> None:
        """The request ended in a way that says nothing about the engine's load.

        (A client's own 4xx, a disconnect.) No mode learns from it; it is
        reported so every finished request has exactly one outcome.
        """

    def on_kv_usage(self, usage: float, *, inflight: int) -> None:
        """One KV-cache usage reading in [0, 1] from the model's engines.

        Ignored unless the mode overrides it.
        """
