"""Tenant shares of a ``vtc`` lane's running slots (DESIGN §6, §7; ``core/tenant_share.py``).

``TenantSlots`` arithmetic, then the rule through the real ``Scheduler``: a
tenant under its share whose ticket is blocked gets a slot back from the tenant
furthest over its share, by preemption, as the lane's ``preemptible`` allows.
"""

from __future__ import annotations

from typing import Any

import pytest

from sluicegate.core.decisions import Admit, Decision, Preempt, PreemptAction, Queued
from sluicegate.core.entry import State
from sluicegate.core.scheduler import Scheduler
from sluicegate.core.spec import AfterFraction, TenantSpec
from sluicegate.core.tenant_share import TenantSlots
from sluicegate.core.ticket import TicketId, Usage
from tests.core.conftest import LaneFactory, SpecFactory, TicketFactory

OK = Usage(prompt_tokens=100, completion_tokens=10)


def ids(decisions: list[Decision], kind: type[Decision]) -> list[str]:
    """Ids of the tickets in decisions of one kind, in order."""
    return [d.ticket.id for d in decisions if isinstance(d, kind)]


# ------------------------------------------------------------------ TenantSlots


def test_slots_count_tenants_and_their_weight() -> None:
    """``running`` holds only tenants with running tickets; ``running_weight`` sums theirs."""
    slots = TenantSlots({"a": 2.0})
    slots.add("a")
    slots.add("a")
    slots.add("b")
    assert slots.running == {"a": 2, "b": 1}
    assert slots.running_weight == 3.0
    slots.remove("a")
    slots.remove("b")
    assert slots.running == {"a": 1}
    assert slots.running_weight == 2.0
    slots.remove("a")
    assert slots.running == {}
    assert slots.running_weight == 0.0


def test_under_share_counts_the_waiting_tenant_as_active() -> None:
    """A waiting tenant with nothing running shares with the running ones: 4 slots, equal
    weights, b runs 3: a's share is 2, so a may take one (0 + 1 ≤ 2) and a second (1 + 1 ≤ 2),
    but not a third."""
    slots = TenantSlots({})
    for _ in range(3):
        slots.add("b")
    assert slots.under_share("a", 4)
    slots.add("a")
    assert slots.under_share("a", 4)
    slots.add("a")
    assert not slots.under_share("a", 4)


def test_a_lone_tenant_is_under_share_until_the_lane_is_full() -> None:
    """Work-conserving: alone, a tenant's share is every slot."""
    slots = TenantSlots({})
    for _ in range(3):
        slots.add("a")
    assert slots.under_share("a", 4)
    slots.add("a")
    assert not slots.under_share("a", 4)


def test_over_share_only_when_still_at_share_after_giving_one_back() -> None:
    """Share 2 of 4 slots: 3 running is over (3 − 1 ≥ 2, ratio 1.5); 2 is not; weights move
    the share (b at weight 3 owns 3 of 4 slots, so 3 running is within it)."""
    slots = TenantSlots({})
    for _ in range(3):
        slots.add("b")
    assert slots.over_share("b", "a", 4) == pytest.approx(1.5)
    slots.remove("b")
    assert slots.over_share("b", "a", 4) == 0.0
    weighted = TenantSlots({"b": 3.0})
    for _ in range(3):
        weighted.add("b")
    assert weighted.over_share("b", "a", 4) == 0.0
    weighted.add("b")
    assert weighted.over_share("b", "a", 4) == pytest.approx(4 / 3)


# ------------------------------------------------------------------ through the scheduler


def share_lane(make_spec: SpecFactory, make_lane: LaneFactory, **lane: Any) -> Scheduler:
    """One ``fifo``/``vtc`` lane of 4 slots (model cap 4), preemptible ``always`` by default."""
    fields: dict[str, Any] = {"max_concurrency": 4, "fairness": "vtc", "preemptible": "always"}
    fields.update(lane)
    tenants = fields.pop("tenants", ())
    return Scheduler(make_spec(make_lane(**fields), max_concurrency=4, tenants=tenants))


def fill(sched: Scheduler, make_ticket: TicketFactory, tenant: str, n: int, now: float) -> None:
    """Submit ``n`` tickets of ``tenant`` at ``now``; each must be admitted at once."""
    for i in range(n):
        out = sched.submit(make_ticket(f"{tenant}{i}", tenant=tenant), now)
        assert ids(out, Admit) == [f"{tenant}{i}"]


def test_a_lone_tenant_fills_the_lane_without_preemption(
    make_spec: SpecFactory, make_lane: LaneFactory, make_ticket: TicketFactory
) -> None:
    """Work-conserving: one tenant runs on every slot; its fifth ticket waits, nobody is
    preempted for it."""
    sched = share_lane(make_spec, make_lane)
    fill(sched, make_ticket, "noisy", 4, 0.0)
    out = sched.submit(make_ticket("noisy4", tenant="noisy"), 1.0)
    assert len(out) == 1
    assert ids(out, Queued) == ["noisy4"]


def test_under_share_tenant_gets_the_newest_over_share_slot(
    make_spec: SpecFactory, make_lane: LaneFactory, make_ticket: TicketFactory
) -> None:
    """quiet arrives at a lane noisy fills: noisy's most recently admitted ticket is
    preempted (abort), and quiet runs as soon as the driver completes it."""
    sched = share_lane(make_spec, make_lane)
    fill(sched, make_ticket, "noisy", 3, 0.0)
    assert ids(sched.submit(make_ticket("noisy3", tenant="noisy"), 0.5), Admit) == ["noisy3"]
    out = sched.submit(make_ticket("quiet0", tenant="quiet"), 1.0)
    assert ids(out, Queued) == ["quiet0"]
    (preempt,) = [d for d in out if isinstance(d, Preempt)]
    assert (preempt.ticket.id, preempt.action) == ("noisy3", PreemptAction.ABORT)
    assert ids(sched.complete(TicketId("noisy3"), OK, 1.1), Admit) == ["quiet0"]
    assert sched.state_of(TicketId("noisy3")) is None


def test_give_back_stops_at_the_share(
    make_spec: SpecFactory, make_lane: LaneFactory, make_ticket: TicketFactory
) -> None:
    """Equal weights, 4 slots: quiet takes back two slots, and its third ticket waits for a
    natural completion (noisy is at its share of 2)."""
    sched = share_lane(make_spec, make_lane)
    fill(sched, make_ticket, "noisy", 4, 0.0)
    for i, victim in enumerate(("noisy3", "noisy2")):
        out = sched.submit(make_ticket(f"quiet{i}", tenant="quiet"), 1.0 + i)
        assert ids(out, Preempt) == [victim]
        assert ids(sched.complete(TicketId(victim), OK, 1.5 + i), Admit) == [f"quiet{i}"]
    out = sched.submit(make_ticket("quiet2", tenant="quiet"), 5.0)
    assert ids(out, Preempt) == []
    assert ids(out, Queued) == ["quiet2"]


def test_shares_are_weighted(
    make_spec: SpecFactory, make_lane: LaneFactory, make_ticket: TicketFactory
) -> None:
    """quiet at weight 3, noisy at 1, 4 slots: quiet takes back three slots, not two."""
    tenants = (TenantSpec(name="quiet", weight=3.0), TenantSpec(name="noisy", weight=1.0))
    sched = share_lane(make_spec, make_lane, tenants=tenants)
    fill(sched, make_ticket, "noisy", 4, 0.0)
    taken = 0
    for i in range(4):
        out = sched.submit(make_ticket(f"quiet{i}", tenant="quiet"), 1.0 + i)
        victims = ids(out, Preempt)
        if not victims:
            break
        assert ids(sched.complete(TicketId(victims[0]), OK, 1.5 + i), Admit) == [f"quiet{i}"]
        taken += 1
    assert taken == 3


def test_requeue_puts_the_victim_back_and_counts_it(
    make_spec: SpecFactory, make_lane: LaneFactory, make_ticket: TicketFactory
) -> None:
    """``preempt_action: requeue``: the victim waits again after quiet is admitted."""
    sched = share_lane(make_spec, make_lane, preempt_action="requeue", max_requeues=1)
    fill(sched, make_ticket, "noisy", 4, 0.0)
    out = sched.submit(make_ticket("quiet0", tenant="quiet"), 1.0)
    (preempt,) = [d for d in out if isinstance(d, Preempt)]
    assert preempt.action is PreemptAction.REQUEUE
    assert ids(sched.complete(preempt.ticket.id, OK, 1.1), Admit) == ["quiet0"]
    assert sched.state_of(preempt.ticket.id) is State.QUEUED


@pytest.mark.parametrize("preemptible", ["never", "priority"])
def test_no_preemption_where_the_lane_forbids_it(
    make_spec: SpecFactory, make_lane: LaneFactory, make_ticket: TicketFactory, preemptible: str
) -> None:
    """``never`` (and ``priority`` for priority-2 tickets without progress): quiet waits for
    a natural completion, and then takes the slot although noisy's counter, corrected
    down by a short answer, is the smaller: shares steer admission."""
    sched = share_lane(make_spec, make_lane, preemptible=preemptible)
    fill(sched, make_ticket, "noisy", 4, 0.0)
    sched.submit(make_ticket("noisy4", tenant="noisy"), 0.5)
    out = sched.submit(make_ticket("quiet0", tenant="quiet"), 1.0)
    assert ids(out, Preempt) == []
    assert ids(sched.complete(TicketId("noisy0"), OK, 2.0), Admit) == ["quiet0"]
    assert ids(sched.complete(TicketId("noisy1"), OK, 2.5), Admit) == ["noisy4"]


def test_priority_tiers_give_back_only_from_tiers_four_and_five(
    make_spec: SpecFactory, make_lane: LaneFactory, make_ticket: TicketFactory
) -> None:
    """``preemptible: priority``: a priority-2 ticket past 80% is not taken for a share (it
    would lose most of its work); a priority-4 ticket is, at once."""
    sched = share_lane(make_spec, make_lane, preemptible="priority")
    for i in range(3):
        sched.submit(make_ticket(f"noisy{i}", tenant="noisy", streaming=True), 0.0)
    sched.submit(make_ticket("noisy3", tenant="noisy", priority=4, streaming=True), 0.0)
    for i in range(3):
        sched.progress(TicketId(f"noisy{i}"), 90)
    out = sched.submit(make_ticket("quiet0", tenant="quiet"), 1.0)
    assert ids(out, Preempt) == ["noisy3"]
    assert ids(sched.complete(TicketId("noisy3"), OK, 1.1), Admit) == ["quiet0"]
    out = sched.submit(make_ticket("quiet1", tenant="quiet"), 2.0)
    assert ids(out, Preempt) == []
    assert sched.next_wakeup() == pytest.approx(2.0 + 3600.0)  # only quiet1's queue timeout


def test_after_fraction_lane_gives_slots_back_by_finishing(
    make_spec: SpecFactory, make_lane: LaneFactory, make_ticket: TicketFactory
) -> None:
    """``after_fraction: 0.5``: a victim would lose at least half its work while waiting
    for it costs at most the other half, so no share preemption, even past the fraction."""
    sched = share_lane(make_spec, make_lane, preemptible=AfterFraction(after_fraction=0.5))
    for i in range(4):
        sched.submit(make_ticket(f"noisy{i}", tenant="noisy", streaming=True), 0.0)
    out = sched.submit(make_ticket("quiet0", tenant="quiet"), 1.0)
    assert ids(out, Preempt) == []
    sched.progress(TicketId("noisy1"), 50)
    assert ids(sched.tick(1.5), Preempt) == []
    assert ids(sched.complete(TicketId("noisy1"), OK, 2.0), Admit) == ["quiet0"]


def test_a_more_important_ticket_is_not_a_victim(
    make_spec: SpecFactory, make_lane: LaneFactory, make_ticket: TicketFactory
) -> None:
    """Shares never preempt a ticket more important than the waiting one."""
    sched = share_lane(make_spec, make_lane)
    for i in range(4):
        sched.submit(make_ticket(f"noisy{i}", tenant="noisy", priority=1), 0.0)
    out = sched.submit(make_ticket("quiet0", tenant="quiet", priority=3), 1.0)
    assert ids(out, Preempt) == []


def test_preempt_after_ms_is_a_grace(
    make_spec: SpecFactory, make_lane: LaneFactory, make_ticket: TicketFactory
) -> None:
    """With ``preempt_after_ms: 200`` the waiting tenant first waits 200 ms for a completion."""
    sched = share_lane(make_spec, make_lane, preempt_after_ms=200.0)
    fill(sched, make_ticket, "noisy", 4, 0.0)
    out = sched.submit(make_ticket("quiet0", tenant="quiet"), 1.0)
    assert ids(out, Preempt) == []
    assert sched.next_wakeup() == pytest.approx(1.2)
    assert ids(sched.tick(1.1), Preempt) == []
    assert ids(sched.tick(1.2), Preempt) == ["noisy3"]


def test_lanes_without_vtc_share_nothing(
    make_spec: SpecFactory, make_lane: LaneFactory, make_ticket: TicketFactory
) -> None:
    """Fairness ``none``: the lane is one flow, and no tenant is preempted for another."""
    sched = share_lane(make_spec, make_lane, fairness="none")
    fill(sched, make_ticket, "noisy", 4, 0.0)
    assert ids(sched.submit(make_ticket("quiet0", tenant="quiet"), 1.0), Preempt) == []


def test_a_victim_admitted_this_instant_is_spared(
    make_spec: SpecFactory, make_lane: LaneFactory, make_ticket: TicketFactory
) -> None:
    """No churn: tickets admitted at this very instant are never preempted."""
    sched = share_lane(make_spec, make_lane)
    fill(sched, make_ticket, "noisy", 4, 1.0)
    assert ids(sched.submit(make_ticket("quiet0", tenant="quiet"), 1.0), Preempt) == []


def test_admission_gives_a_free_slot_to_the_tenant_under_its_share(
    make_spec: SpecFactory, make_lane: LaneFactory, make_ticket: TicketFactory
) -> None:
    """A freed slot goes to a waiting tenant under its share, even when the tenant over its
    share has the smaller fair-share counter (the VTC order alone would pick it); nothing is
    preempted (``never``). Once both hold their share, the counter decides again."""
    sched = share_lane(make_spec, make_lane, preemptible="never")
    sched.submit(make_ticket("big", tenant="quiet"), 0.0)
    sched.complete(TicketId("big"), Usage(prompt_tokens=100, completion_tokens=5000), 0.5)
    fill(sched, make_ticket, "noisy", 4, 1.0)
    for i in (4, 5):
        sched.submit(make_ticket(f"noisy{i}", tenant="noisy"), 1.0)
    sched.submit(make_ticket("quiet0", tenant="quiet"), 2.0)
    sched.submit(make_ticket("quiet1", tenant="quiet"), 2.0)
    assert sched.counter("m", "main", "quiet") > sched.counter("m", "main", "noisy")
    assert ids(sched.complete(TicketId("noisy0"), OK, 3.0), Admit) == ["quiet0"]
    assert ids(sched.complete(TicketId("noisy1"), OK, 3.1), Admit) == ["quiet1"]
    assert ids(sched.complete(TicketId("noisy2"), OK, 3.2), Admit) == ["noisy4"]
