"""The adaptive-limit seam: an effective concurrency limit moved by feedback."""

from __future__ import annotations

from typing import ClassVar, Protocol

from sluicegate.core.registry import Registry


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

    def on_sample(self, *, rtt_s: float, inflight: int, dropped: bool) -> None:
        """One latency sample (time to first token) taken with ``inflight`` running."""
        ...

    def on_kv_usage(self, usage: float, *, inflight: int) -> None:
        """One KV-cache usage reading in [0, 1] from the model's engines."""
        ...


LIMITS: Registry[type[Limit]] = Registry("adaptive limit mode")
