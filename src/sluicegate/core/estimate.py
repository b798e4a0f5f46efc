"""A waiting ticket's start estimate from its lane's work ahead (DESIGN §5, §16).

The estimated wait of a ticket in lane L is 0 when L's queue is empty and L has
room; otherwise the remaining predicted work of L's running tickets plus the
queued work L's policy serves before the ticket (``LaneQueue.work_ahead``),
over L's effective slots. Only lanes whose queue tracks work (``shed_hopeless``,
``LaneQueue.track_work``) can answer.

In distributed mode the other replicas' work in L joins it (``RemoteWork``, which the
store link sets through ``Scheduler.set_remote_work``): their running work whole, and
of their queued work what L's policy would serve before the ticket. ``lane_work`` is
what this replica publishes for theirs.
"""

from __future__ import annotations

from collections.abc import Mapping

from sluicegate.core.entry import Entry
from sluicegate.core.fair_queue import FairQueue
from sluicegate.core.queues import HeapQueue
from sluicegate.core.runtime import LaneRuntime, ModelRuntime
from sluicegate.core.work_ahead import (
    MARKS,
    TENANT_MARKS,
    LaneWork,
    RemoteWork,
    start_estimate_s,
)


def start_estimate(model: ModelRuntime, lane: LaneRuntime, entry: Entry, now: float) -> float:
    """Estimated wait from ``now`` until ``entry`` (queued in ``lane`` or about to be) starts.

    ``lane``'s queue must track work.
    """
    queue = lane.queue
    remote = lane.remote
    if remote is None:
        if len(queue) == 0 and model.lane_has_room(lane):
            return 0.0
        slots = model.lane_slots(lane)
        return start_estimate_s(queue.running_work(now), queue.work_ahead(entry), slots)
    slots = model.lane_slots(lane)
    if (
        len(queue) == 0
        and remote.waiting == 0
        and model.lane_has_room(lane)
        and lane.running + remote.running < slots
    ):
        return 0.0
    running = queue.running_work(now) + remote.running_s
    if isinstance(queue, FairQueue):
        own = remote.ahead(lane.order(entry), entry.ticket.tenant)
        ahead = queue.work_ahead_with(entry, own, remote.tenants)
    else:
        ahead = queue.work_ahead(entry) + remote.ahead(lane.order(entry))
    return start_estimate_s(running, ahead, slots)


def lane_work(lane: LaneRuntime, now: float) -> LaneWork:
    """What ``lane`` (its queue tracking work) holds at ``now``, as published to the other
    replicas: its running units and their remaining work, its queued tickets and their
    work, and where that work stands in the policy's order (a ``vtc`` lane: per tenant)."""
    queue = lane.queue
    running_s = queue.running_work(now)
    if isinstance(queue, FairQueue):
        tenants = queue.tenant_work(TENANT_MARKS)
        return LaneWork(lane.running, running_s, len(queue), queue.total_work, tenants=tenants)
    assert isinstance(queue, HeapQueue)
    marks = queue.work_marks(MARKS)
    return LaneWork(lane.running, running_s, len(queue), queue.total_work, marks=marks)


def set_remote(model: ModelRuntime, remote: Mapping[str, RemoteWork]) -> None:
    """Make ``remote`` the other replicas' work in ``model``'s shedding lanes (a lane it does
    not name has none)."""
    for lane in model.lane_order:
        lane.remote = remote.get(lane.spec.name) if lane.spec.shed_hopeless else None
