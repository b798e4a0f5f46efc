"""The two dimensions of a lane's queue policy: fairness between flows, ordering within one.

Which waiting ticket a lane serves next is decided in two steps, as in the
Gateway API Inference Extension's flow control: a *fairness* policy picks the
flow (the tenant), then an *ordering* picks the ticket within that flow.

- An ordering is an ``Ordering``: a time-invariant key, smaller first.
- A fairness policy is a ``FairnessFactory``: it builds the lane's
  ``LaneQueue`` around the ordering's key. ``none`` (``single_flow``) keeps one
  heap for the whole lane; ``vtc`` (``FairQueue``) keeps a heap per tenant and
  serves the tenant with the smallest virtual token counter.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from typing import ClassVar

from sluicegate.core.entry import Entry
from sluicegate.core.queues import HeapQueue, KeyFn, LaneQueue


class Ordering(ABC):
    """How one flow orders its waiting tickets: ``key(entry)``, smaller served first.

    Contract: the key is time-invariant (a deadline, not a remaining slack), so
    a heap never needs re-sorting and every queue operation stays O(log n);
    ties fall to submission order.

    An abstract base class rather than a Protocol because orderings share state
    and defaults: the lane's ``aging`` and ``simulation_only = False``. A
    subclass sets ``name`` and implements ``key``; one that forgets ``key``
    fails when it is built, not when a ticket first queues.
    """

    name: ClassVar[str]
    simulation_only: ClassVar[bool] = False
    """Needs what only the simulator knows (a request's true output length)."""

    def __init__(self, aging: float = 1.0) -> None:
        self.aging = aging

    @abstractmethod
    def key(self, entry: Entry) -> tuple[float, ...]:
        """Smaller is served first; ties fall back to submission order."""


FairnessFactory = Callable[[KeyFn, Mapping[str, float]], LaneQueue]
"""Builds a lane's queue from the ordering's key and the tenants' fair-share weights."""


def single_flow(key: KeyFn, weights: Mapping[str, float]) -> LaneQueue:
    """Fairness ``none``: the whole lane is one flow, one heap ordered by ``key``."""
    return HeapQueue(key)
