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


def start_estimate(model: ModelRuntime, lane: LaneRuntime, entry: Entry, now: float) -> float:
    """Estimated wait from ``now`` until ``entry`` (queued in ``lane`` or about to be) starts.

    ``lane``'s queue must track work.
    """
    queue = lane.queue
    if len(queue) == 0 and model.lane_has_room(lane):
        return 0.0
    slots = model.lane_slots(lane)
    return start_estimate_s(queue.running_work(now), queue.work_ahead(entry), slots)
