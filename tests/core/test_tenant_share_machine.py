"""Hypothesis: tenant shares of a ``vtc`` lane hold under any interleaving (DESIGN §6, §7).

A state machine drives two weighted tenants through one ``vtc`` lane
(preemptible ``always``, abort or requeue) with random submits, completions,
driver-side ends of preemptions and ticks, and checks after every step:

* every ticket ends exactly once, and the lane's per-tenant running counts agree
  with the driver's (and return to zero);
* (i) a tenant under its share is never left waiting at the head of a full lane
  while another tenant runs over its share, unless a preemption is already on
  its way or every such ticket was admitted this very instant;
* (ii) work-conserving: while tickets wait, the lane runs on every slot, and
  while only one tenant is live no ticket is ever preempted;
* (iii) shares are weighted: the share in (i) is ``slots × w / Σ w``.

A second property fills the lane with one tenant and checks that another takes
back exactly its weighted share, no more.
"""

from __future__ import annotations

from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from sluicegate.core import (
    Admit,
    Decision,
    Preempt,
    PreemptAction,
    Scheduler,
    TenantSpec,
    Ticket,
    TicketId,
    Usage,
)
from sluicegate.core.runtime import LaneRuntime
from tests.core.conftest import LANE, MODEL, build_lane, build_spec, build_ticket, machine_settings

TENANTS = ("quiet", "noisy")


def _scheduler(cap: int, weights: tuple[float, float], policy: str, requeue: bool) -> Scheduler:
    lane = build_lane(
        max_concurrency=cap,
        max_queue=1000,
        queue_timeout_s=1e6,
        slo_ms=1e9,
        policy=policy,
        fairness="vtc",
        preemptible="always",
        preempt_action="requeue" if requeue else "abort",
        max_requeues=1,
    )
    tenants = [TenantSpec(name=n, weight=w) for n, w in zip(TENANTS, weights, strict=True)]
    spec = build_spec(lane, tenants=tenants, max_concurrency=cap, max_inflight_tokens=None)
    return Scheduler(spec)


def _lane(sched: Scheduler) -> LaneRuntime:
    # Observation only: the lane's head and per-tenant counts are not in any public view.
    return sched._models[MODEL].lanes[LANE]


class ShareMachine(RuleBasedStateMachine):
    """Two tenants, one ``vtc`` lane; the driver executes every decision."""

    def __init__(self) -> None:
        super().__init__()
        self.now = 0.0
        self.n = 0
        self.tickets: dict[str, Ticket] = {}
        self.queued: set[str] = set()
        self.running: dict[str, float] = {}  # id -> admitted at
        self.preempting: set[str] = set()
        self.ended: Counter[str] = Counter()
        self.preempted_alone = False

    @initialize(
        cap=st.integers(1, 6),
        weights=st.tuples(st.sampled_from([1.0, 2.0, 3.0]), st.sampled_from([1.0, 2.0, 3.0])),
        policy=st.sampled_from(["fair", "fifo", "sjf"]),
        requeue=st.booleans(),
    )
    def setup(self, cap: int, weights: tuple[float, float], policy: str, requeue: bool) -> None:
        self.cap = cap
        self.weights = dict(zip(TENANTS, weights, strict=True))
        self.s = _scheduler(cap, weights, policy, requeue)

    # ------------------------------------------------------------------ driver

    def _live_tenants(self) -> set[str]:
        live = self.queued | set(self.running)
        return {self.tickets[tid].tenant for tid in live}

    def _apply(self, decisions: list[Decision]) -> None:
        alone = len(self._live_tenants()) <= 1
        for d in decisions:
            tid = d.ticket.id
            if isinstance(d, Admit):
                assert tid in self.queued, f"{tid} admitted from nowhere"
                self.queued.discard(tid)
                self.running[tid] = self.now
            elif isinstance(d, Preempt):
                assert tid in self.running
                assert tid not in self.preempting
                self.preempting.add(tid)
                self.preempted_alone = self.preempted_alone or alone
            else:
                assert tid in self.queued, f"unexpected {d}"

    def _advance(self, dt: float) -> None:
        """Time passes; like a real driver, tick at every wakeup on the way."""
        target = self.now + dt
        while (wakeup := self.s.next_wakeup()) is not None and wakeup <= target:
            self.now = max(self.now, wakeup)
            self._apply(self.s.tick(self.now))
        self.now = target

    def _complete(self, tid: str, tokens: int) -> None:
        was_preempting = tid in self.preempting
        decisions = self.s.complete(TicketId(tid), Usage(100, tokens), self.now)
        del self.running[tid]
        self.preempting.discard(tid)
        if was_preempting and self.s.state_of(TicketId(tid)) is not None:
            self.queued.add(tid)  # requeued
        else:
            assert self.s.state_of(TicketId(tid)) is None
            self.ended[tid] += 1
            assert self.ended[tid] == 1, f"{tid} ended twice"
        self._apply(decisions)

    # ------------------------------------------------------------------ rules

    @rule(
        tenant=st.sampled_from(TENANTS),
        prompt=st.integers(1, 400),
        max_tokens=st.integers(1, 300),
        dt=st.sampled_from([0.0, 0.01, 0.5]),
    )
    def submit(self, tenant: str, prompt: int, max_tokens: int, dt: float) -> None:
        self._advance(dt)
        self.n += 1
        tid = f"t{self.n}"
        ticket = Ticket(
            id=TicketId(tid),
            model=MODEL,
            tenant=tenant,
            lane=LANE,
            priority=2,
            prompt_tokens=prompt,
            max_tokens=max_tokens,
            arrival=self.now,
        )
        self.tickets[tid] = ticket
        self.queued.add(tid)
        self._apply(self.s.submit(ticket, self.now))

    @precondition(lambda self: bool(set(self.running) - self.preempting))
    @rule(data=st.data(), dt=st.sampled_from([0.0, 0.01, 1.0]))
    def complete(self, data: st.DataObject, dt: float) -> None:
        self._advance(dt)
        tid = data.draw(st.sampled_from(sorted(set(self.running) - self.preempting)))
        self._complete(tid, data.draw(st.integers(0, self.tickets[tid].max_tokens)))

    @precondition(lambda self: bool(self.preempting))
    @rule(data=st.data(), dt=st.sampled_from([0.0, 0.01]))
    def end_preemption(self, data: st.DataObject, dt: float) -> None:
        """The driver has stopped the victim upstream and reports it."""
        self._advance(dt)
        self._complete(data.draw(st.sampled_from(sorted(self.preempting))), 0)

    @rule(dt=st.sampled_from([0.0, 0.5]))
    def tick(self, dt: float) -> None:
        self._advance(dt)
        self._apply(self.s.tick(self.now))

    # ------------------------------------------------------------------ invariants

    def _counts(self) -> Counter[str]:
        return Counter(self.tickets[tid].tenant for tid in self.running)

    @invariant()
    def counts_agree(self) -> None:
        shares = _lane(self.s).shares
        assert shares is not None
        assert shares.running == dict(self._counts())
        assert shares.running_weight == sum(self.weights[t] for t in self._counts())

    @invariant()
    def work_conserving(self) -> None:
        """(ii) Waiting tickets mean every slot is in use; a lone tenant is never preempted."""
        if self.queued:
            assert len(self.running) == self.cap
        assert not self.preempted_alone

    @invariant()
    def under_share_head_is_served(self) -> None:
        """(i), (iii) A blocked head under its weighted share has a preemption on its way, or
        no preemptible over-share ticket exists."""
        head = _lane(self.s).queue.peek()
        if head is None or self.preempting:
            return
        counts = self._counts()
        h = head.ticket.tenant
        active = set(counts) | {h}
        total = sum(self.weights[t] for t in active)
        if (counts[h] + 1) * total > self.cap * self.weights[h]:
            return  # not under its share: it waits for a completion
        for tid, admitted in self.running.items():
            u = self.tickets[tid].tenant
            over = u != h and (counts[u] - 1) * total >= self.cap * self.weights[u]
            assert not (over and admitted < self.now), (
                f"{h} under share waits while {u} runs {counts[u]} of {self.cap}"
            )

    def teardown(self) -> None:
        if not hasattr(self, "s"):
            return
        for _ in range(10_000):
            if not self.running:
                break
            self.now += 1.0
            self._complete(sorted(self.running)[0], 1)
        assert not self.queued
        assert not self.running
        assert self.s.live_tickets() == 0
        shares = _lane(self.s).shares
        assert shares is not None
        assert shares.running == {}
        assert shares.running_weight == 0.0
        assert set(self.ended) == set(self.tickets)


ShareMachine.TestCase.settings = machine_settings(max_examples=150)
TestTenantShares = ShareMachine.TestCase


@settings(max_examples=200, deadline=None)
@given(
    cap=st.integers(1, 12),
    w_quiet=st.sampled_from([1.0, 2.0, 3.0, 5.0]),
    w_noisy=st.sampled_from([1.0, 2.0, 3.0]),
)
def test_give_back_stops_exactly_at_the_weighted_share(
    cap: int, w_quiet: float, w_noisy: float
) -> None:
    """noisy fills the lane; quiet then asks for every slot, one ticket at a time. quiet takes
    back slots while one more keeps it within ``cap × w_q / (w_q + w_n)`` and noisy keeps at
    least its own share, then stops: it ends within its share and could take no more."""
    sched = _scheduler(cap, (w_quiet, w_noisy), "fifo", requeue=False)
    now = 0.0
    for i in range(cap):
        sched.submit(_ticket(f"n{i}", "noisy", now), now)
    taken = 0
    for i in range(cap):
        now += 1.0
        out = sched.submit(_ticket(f"q{i}", "quiet", now), now)
        victims = [d.ticket.id for d in out if isinstance(d, Preempt)]
        if not victims:
            break
        assert all(d.action is PreemptAction.ABORT for d in out if isinstance(d, Preempt))
        now += 0.1
        admitted = sched.complete(victims[0], Usage(100, 0), now)
        assert [d.ticket.id for d in admitted if isinstance(d, Admit)] == [f"q{i}"]
        taken += 1
    total = w_quiet + w_noisy
    assert taken * total <= cap * w_quiet  # within its share
    could_take = (taken + 1) * total <= cap * w_quiet
    noisy_spares = (cap - taken - 1) * total >= cap * w_noisy
    assert not (could_take and noisy_spares)


def _ticket(name: str, tenant: str, now: float) -> Ticket:
    return build_ticket(name, tenant=tenant, arrival=now)
