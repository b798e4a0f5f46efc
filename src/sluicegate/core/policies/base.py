"""The policy seam: how a lane orders its waiting tickets."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import ClassVar, Protocol

from sluicegate.core.entry import Entry
from sluicegate.core.queues import HeapQueue, LaneQueue
from sluicegate.core.registry import Registry
from sluicegate.core.spec import LaneSpec


class Policy(Protocol):
    """Builds the queue a lane uses.

    Contract: the queue's order may depend on time only through keys that are
    time-invariant (a deadline, not a remaining slack), so every operation
    stays O(log n) without re-sorting.
    """

    name: ClassVar[str]
    simulation_only: ClassVar[bool]
    """Needs what only the simulator knows (a request's true output length)."""

    def make_queue(self, lane: LaneSpec, weights: Mapping[str, float]) -> LaneQueue:
        """A fresh queue for ``lane``; ``weights`` are the tenants' fair-share weights."""
        ...


class KeyedPolicy(ABC):
    """Base for single-flow policies: subclasses define a time-invariant ``key``."""

    name: ClassVar[str]
    simulation_only: ClassVar[bool] = False

    def __init__(self, lane: LaneSpec | None = None) -> None:
        self.aging = lane.aging if lane is not None else 1.0

    @abstractmethod
    def key(self, entry: Entry) -> tuple[float, ...]:
        """Smaller is served first; ties fall back to submission order."""

    def make_queue(self, lane: LaneSpec, weights: Mapping[str, float]) -> LaneQueue:
        """A heap ordered by this policy's key."""
        return HeapQueue(type(self)(lane).key)


POLICIES: Registry[type[Policy]] = Registry("policy")
