"""The adaptive-limit seam: an effective concurrency limit moved by feedback."""

from __future__ import annotations

import enum
from typing import ClassVar, Protocol

from sluicegate.core.registry import Registry


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


class Limit(Protocol):
    """A concurrency limit that never reads a clock: callers pass every sample.

    Contract: ``value`` stays within ``[spec.floor, cap]``; samples a mode
    does not use are ignored.
    """

    name: ClassVar[str]

    @property
    def value(self) -> int:
        """The current effective limit."""
        ...

    def on_sample(
        self,
        *,
        rtt_s: float,
        inflight: int,
        dropped: bool,
        kind: SampleKind = SampleKind.FIRST_TOKEN,
    ) -> None:
        """One finished request, taken with ``inflight`` running (itself included).

        ``dropped`` means the engine failed, timed out or refused the request
        for load; ``rtt_s`` and ``kind`` then carry no meaning. Otherwise
        ``rtt_s`` is a latency sample of ``kind``.
        """
        ...

    def on_kv_usage(self, usage: float, *, inflight: int) -> None:
        """One KV-cache usage reading in [0, 1] from the model's engines."""
        ...


LIMITS: Registry[type[Limit]] = Registry("adaptive limit mode")
