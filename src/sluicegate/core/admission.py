"""Admission: grant a model's free capacity to its waiting tickets (DESIGN §5).

While the model is under its effective cap, lanes are visited in configuration
order (lanes owed a preempted slot first) and each admits its head while it is
under its own cap, the head fits the token budget and the router finds a
backend; then a second pass lets lanes with ``borrow`` take the idle quota of
lending lanes. A head that does not fit blocks its lane (no skipping); when no
backend is available, admission stops for the model. ``admit_granted`` is distributed
mode's admission: the store granted the slot, the router picks the backend.

Admission decides; the slot accounting of an admission is ``ModelRuntime.occupy``.
"""

from __future__ import annotations

from sluicegate.core.decisions import Admit, Decision
from sluicegate.core.entry import Entry
from sluicegate.core.fair_queue import FairQueue
from sluicegate.core.runtime import LaneRuntime, ModelRuntime


def admit_waiting(model: ModelRuntime, now: float, out: list[Decision]) -> None:
    """Admit waiting tickets of ``model`` while capacity remains; append the ``Admit``s.

    Args:
        model: The model whose lanes to serve.
        now: The driver's time.
        out: Decisions are appended here.
    """
    lanes = model.lane_order
    if any(lane.pending_preempts for lane in lanes):
        lanes = sorted(lanes, key=lambda lane: lane.pending_preempts == 0)
    cap = model.cap()
    for borrowing in (False, True):
        for lane in lanes:
            if model.running >= cap:
                return
            if not _admit_lane(model, lane, borrowing, cap, now, out):
                return


def _admit_lane(
    model: ModelRuntime,
    lane: LaneRuntime,
    borrowing: bool,
    cap: int,
    now: float,
    out: list[Decision],
) -> bool:
    """Admit from ``lane`` while it has room; ``False`` if no backend could take one."""
    queue = lane.queue
    if borrowing and not lane.borrow:
        return True
    while len(queue) and model.running < cap:
        if borrowing:
            if model.lendable() <= 0:
                return True
        elif lane.own >= lane.cap:
            return True
        head = queue.peek()
        if head is None:
            return True
        first = head
        if lane.shares is not None and isinstance(queue, FairQueue):
            head = _under_share_head(model, lane, queue, head)
        if not model.tokens_fit(head):
            return True
        if not model.units_fit(lane, head, borrowing):
            # A head of several units waits for them to free. Short of the model's: lanes
            # after it admit nothing meanwhile, or single units behind it would keep
            # taking them (as with no backend free for it).
            return model.running + head.ticket.units <= cap
        backend = model.router.choose(head.ticket, head.service_s, model.backends, now)
        if backend is None:
            return False
        if head is first:
            queue.pop()
        else:
            queue.remove(head)
        model.occupy(lane, head, backend, borrowing, now)
        ticket = head.ticket
        out.append(Admit(ticket, backend.spec.name, now - ticket.arrival))
    return True


def admit_granted(model: ModelRuntime, lane: LaneRuntime, entry: Entry, now: float) -> Admit | None:
    """Distributed mode: run queued ``entry``, granted a global slot by the shared store,
    on the backend the router picks; ``None`` when no backend is free (it stays queued).

    The store enforced the caps and budgets: only a backend is chosen here.
    """
    backend = model.router.choose(entry.ticket, entry.service_s, model.backends, now)
    if backend is None:
        return None
    lane.queue.remove(entry)
    model.occupy(lane, entry, backend, False, now)
    return Admit(entry.ticket, backend.spec.name, now - entry.ticket.arrival)


SHARE_STEERING_TENANTS = 16
"""Admission looks past the least-served tenant for one under its slot share only while at
most this many tenants wait: each look is O(waiting tenants), and with more tenants than
that the shares are a slot or less each, where the VTC order is what divides the slots."""


def _under_share_head(
    model: ModelRuntime, lane: LaneRuntime, queue: FairQueue, head: Entry
) -> Entry:
    """``head``, unless its tenant is at its share of the lane's slots while another
    backlogged tenant is under its own: then that tenant's head (the least served of
    them). The slot goes where a give-back would send it, without stopping anything."""
    shares = lane.shares
    assert shares is not None
    slots = min(lane.cap, model.cap())
    tenant = head.ticket.tenant
    if queue.backlogged > SHARE_STEERING_TENANTS or not shares.may_be_at_share(tenant, slots):
        return head
    other = queue.peek_among(
        lambda t: t != tenant and shares.under_share(t, slots) and shares.at_share(tenant, t, slots)
    )
    return head if other is None else other
