"""A waiting ticket's start estimate from its lane's work ahead (DESIGN §5).

The estimated wait of a ticket in lane L is 0 when L's queue is empty and L has
room; otherwise the remaining predicted work of L's running tickets plus the
queued work L's policy serves before the ticket (``LaneQueue.work_ahead``),
over L's effective slots. Only lanes whose queue tracks work (``shed_hopeless``,
``LaneQueue.track_work``) can answer.
"""

from __future__ import annotations

from sluicegate.core.entry import Entry
from sluicegate.core.runtime import LaneRuntime, ModelRuntime
from sluicegate.core.work_ahead import start_estimate_s


def lane_slots(model: ModelRuntime, lane: LaneRuntime, cap: int) -> int:
    """``lane``'s effective concurrency: its cap, the model's ``cap`` (incl. the adaptive
    limit), and the backends' summed caps when every backend is capped. Borrowed
    capacity is not counted."""
    slots = lane.cap if lane.cap < cap else cap
    backend_slots = model.backend_slots
    if backend_slots is not None and backend_slots < slots:
        return backend_slots
    return slots


def start_estimate(model: ModelRuntime, lane: LaneRuntime, entry: Entry, now: float) -> float:
    """Estimated wait from ``now`` until ``entry`` (queued in ``lane`` or about to be) starts.

    ``lane``'s queue must track work.
    """
    queue = lane.queue
    if len(queue) == 0 and model.lane_has_room(lane):
        return 0.0
    slots = lane_slots(model, lane, model.cap())
    return start_estimate_s(queue.running_work(now), queue.work_ahead(entry), slots)


def queued_wait_s(
    model: ModelRuntime, lane: LaneRuntime, entry: Entry, ahead: float, queued: int, now: float
) -> float | None:
    """``Queued.estimated_wait_s`` of ``entry``, just queued in ``lane``.

    ``None`` in a lane that does not track work; else from ``ahead`` (the work its
    push found before it) while the queue still holds the ``queued`` entries it held
    then (a dispatch only pops, so nothing ahead left), or a fresh ``start_estimate``.
    """
    if not lane.spec.shed_hopeless:
        return None
    queue = lane.queue
    if len(queue) != queued:
        return start_estimate(model, lane, entry, now)
    slots = lane_slots(model, lane, model.cap())
    return start_estimate_s(queue.running_work(now), ahead, slots)
