"""The KV cache events simulated engines publish, delivered to the scheduler late or on time.

A real engine with KV events on (vLLM's ``--kv-events-config``) announces each block
it caches (``BlockStored``) and evicts (``BlockRemoved``) after the step that did so;
the gateway's subscriber feeds them to ``Scheduler.observe_kv_events``, and the
``precise_prefix`` router reads the resulting index. In simulation each replica's
engine records its prefix cache's stores and evictions (``PrefixCache.recording``);
after every engine step the replica hands them to a :class:`KvEventFeed`, grouped
into runs of one kind, due at the step's end plus ``simulation.kv_event_delay_s``
(how late the events reach the gateway). The driver delivers every batch due at or
before an event's time before handling that event, so events due at the very instant
a step ends are seen by the decisions its completion triggers.

Only steps can cache or evict: a pure-decode step (``Engine.plan_decode``) neither
looks the cache up nor inserts into it, and an engine of independent servers has no
prefix cache. The feed is on when a backend of the model has ``kv_events`` or the
model's router is ``precise_prefix``; off, nothing is recorded and the run is the
same as without this module.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence

from sluicegate.core.kv_index import DEFAULT_MAX_BLOCKS, KvEvent, events_of
from sluicegate.core.scheduler import Scheduler
from sluicegate.core.spec import ModelSpec

__all__ = ["PRECISE_ROUTER", "KvEventFeed", "publishes_kv_events"]

PRECISE_ROUTER = "precise_prefix"
"""The router that reads the engines' KV events."""


def publishes_kv_events(model: ModelSpec) -> bool:
    """Whether the model's simulated engines publish KV events: a backend has
    ``kv_events``, or the router is :data:`PRECISE_ROUTER`."""
    return model.router == PRECISE_ROUTER or any(b.kv_events for b in model.backends)


class KvEventFeed:
    """Batches of engine KV events on their way to the scheduler, by due time.

    Args:
        model: the simulated model.
        delay_s: how long after its step a batch reaches the scheduler, ``>= 0``.
        max_blocks: the block index bound of every backend (its ``kv_events.max_blocks``).
    """

    __slots__ = ("_pending", "_seq", "delay_s", "max_blocks", "model")

    def __init__(self, model: str, delay_s: float = 0.0, max_blocks: int = DEFAULT_MAX_BLOCKS):
        if not delay_s >= 0.0:
            raise ValueError(f"kv_event_delay_s must be >= 0, got {delay_s!r}")
        self.model = model
        self.delay_s = delay_s
        self.max_blocks = max_blocks
        self._pending: list[tuple[float, int, str, tuple[KvEvent, ...]]] = []
        self._seq = 0

    @classmethod
    def for_model(cls, model: ModelSpec, delay_s: float) -> KvEventFeed | None:
        """The feed of ``model``'s replicas, or ``None`` when they publish no events
        (:func:`publishes_kv_events`); the bound is the first backend's ``kv_events``
        ``max_blocks`` that has one, else the index's default."""
        if not publishes_kv_events(model):
            return None
        bounds = [b.kv_events.max_blocks for b in model.backends if b.kv_events is not None]
        return cls(model.name, delay_s, bounds[0] if bounds else DEFAULT_MAX_BLOCKS)

    def publish(self, backend: str, drained: Sequence[tuple[bool, int]], step_end: float) -> None:
        """A step of ``backend``'s engine ending at ``step_end`` cached and evicted
        ``drained`` (``PrefixCache.drain_events``); due at ``step_end + delay_s``."""
        if not drained:
            return
        self._seq += 1
        item = (step_end + self.delay_s, self._seq, backend, events_of(drained))
        heapq.heappush(self._pending, item)

    def deliver(self, now: float, scheduler: Scheduler) -> None:
        """Hand the scheduler every batch due at or before ``now``, in due order (ties in
        the order published)."""
        pending = self._pending
        while pending and pending[0][0] <= now:
            _, _, backend, events = heapq.heappop(pending)
            scheduler.observe_kv_events(self.model, backend, events, self.max_blocks)

    def __len__(self) -> int:
        """Batches not yet delivered."""
        return len(self._pending)
