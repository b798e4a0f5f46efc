"""Preemption (DESIGN §7): who may be preempted, when, which victim first, and the search.

Rules. Tiers by priority when a lane says ``preemptible: priority``: 0–1
never; 2–3 only after 80% of ``max_tokens`` is generated (the partial answer
is useful); 4–5 at any time. A lane may instead fix one rule for all its
tickets (``never``, ``always``, or ``after_fraction``). A rule that waits for
part of the answer does not apply to a non-streamed request in an ``abort``
lane: it finishes instead. Its text so far would reach the client only if the
engine streamed it to the gateway, and streaming every such request costs
1.2–2.5× the CPU of relaying it (issue 33), while stopping it past the fraction
frees its slot only for the rest of its answer.

Search (``preempt_for_blocked``, run after admission on every dispatch). For
each lane whose waiting head is *urgent* (its latest start has come, or it has
waited ``preempt_after_ms``) or *reclaiming* (its own quota is lent out while
the model is full), the candidates are running tickets whose stop frees what
the head waits for; the cheapest preemptible one (``victim_order``) is stopped.

Tenant shares (``vtc`` lanes, ``core/tenant_share.py``) come first: when the
blocked head's tenant is under its share of the lane's slots, the newest
preemptible ticket of the tenant furthest over its share gives its slot back.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from sluicegate.core.backend_state import any_healthy
from sluicegate.core.decisions import Decision, Preempt, PreemptAction
from sluicegate.core.entry import Entry, State
from sluicegate.core.runtime import LaneRuntime, ModelRuntime
from sluicegate.core.spec import AfterFraction, LaneSpec, ModelSpec

STANDARD_FRACTION = 0.8
NEVER_BELOW = 2  # priorities 0 and 1
ALWAYS_FROM = 4  # priorities 4 and 5
RECHECK_S = 0.01  # the soonest a ticket admitted now may be preempted for a share


def generated_tokens(entry: Entry, now: float) -> int:
    """Tokens the ticket has produced: reported progress, else an estimate from elapsed time.

    Streaming drivers report progress exactly; for a non-streaming request the
    gateway sees nothing until the end, so the predicted decode rate stands in.
    """
    if entry.generated_tokens or entry.ticket.streaming:
        return entry.generated_tokens
    decoding_s = now - entry.admitted_at - entry.prefill_s
    if decoding_s <= 0:
        return 0
    return min(entry.ticket.max_tokens, int(decoding_s / entry.decode_s_per_token))


def required_fraction(lane: LaneSpec, priority: int, *, streaming: bool) -> float | None:
    """Fraction of ``max_tokens`` a ticket (of ``priority``, streamed or not) must have
    generated to be preemptible; None = never (a non-streamed ticket of an ``abort``
    lane under a rule that waits for a fraction of its answer included)."""
    rule = lane.preemptible
    if rule == "never":
        return None
    if rule == "always":
        return 0.0
    if isinstance(rule, AfterFraction):
        fraction = rule.after_fraction
    elif priority < NEVER_BELOW:
        return None
    else:
        fraction = 0.0 if priority >= ALWAYS_FROM else STANDARD_FRACTION
    if fraction > 0.0 and not streaming and lane.preempt_action == "abort":
        return None
    return fraction


def ever_preemptible(
    model: ModelSpec, lane: LaneSpec, priority: int, most_important: int, *, streaming: bool
) -> bool:
    """Whether a ticket of ``priority`` (streamed or not) running in ``lane`` of ``model``
    could ever be stopped, when no ticket of the model can be more important than
    ``most_important`` (the lowest ``max_priority`` of the tenants that may send to it).
    The lane's rule must allow it, and some search must be able to choose it: an urgent
    waiter more important than it (``_victims``), a lane reclaiming what it lent (only
    tickets that borrowed), or a tenant's share given back (``_share_preempt``)."""
    if required_fraction(lane, priority, streaming=streaming) is None:
        return False
    if priority > most_important:
        return True
    if lane.borrow and any(other.lend for other in model.lanes if other.name != lane.name):
        return True
    rule = share_rule(lane)
    return rule == "always" or (rule == "priority" and priority >= ALWAYS_FROM)


def is_preemptible(entry: Entry, lane: LaneSpec, now: float) -> bool:
    """Whether ``entry`` (running in ``lane``) may be preempted at ``now``."""
    ticket = entry.ticket
    fraction = required_fraction(lane, ticket.priority, streaming=ticket.streaming)
    if fraction is None:
        return False
    if fraction <= 0.0:
        return True
    return generated_tokens(entry, now) >= fraction * entry.ticket.max_tokens


def urgent_time(model: ModelRuntime, lane: LaneSpec, entry: Entry) -> float:
    """When queued ``entry`` becomes urgent: its latest start (deadline less its predicted
    service and the model's slack), or its lane's ``preempt_after_ms`` passed, if sooner."""
    urgent_at = entry.deadline - entry.service_s - model.spec.preempt_slack_s
    after_ms = lane.preempt_after_ms
    if after_ms is not None:
        urgent_at = min(urgent_at, entry.enqueued_at + after_ms / 1000.0)
    return urgent_at


def preemptible_after(lane: LaneSpec, entry: Entry) -> float | None:
    """How long after its admission ``entry`` (of ``lane``) becomes preemptible, by its
    predicted decode rate; ``None`` when never."""
    ticket = entry.ticket
    fraction = required_fraction(lane, ticket.priority, streaming=ticket.streaming)
    if fraction is None:
        return None
    if fraction <= 0.0:
        return 0.0
    return entry.prefill_s + fraction * entry.ticket.max_tokens * entry.decode_s_per_token


def share_rule(lane: LaneSpec) -> str:
    """How a lane gives tenants their shares back by preemption (``_share_preempt``):
    ``always`` (any running ticket of a tenant over its share, of the head's priority or
    less important), ``priority`` (only tiers 4–5), or ``""``: not at all (no ``vtc``
    fairness, or a lane whose tickets are never or only fraction-preemptible)."""
    rule = lane.preemptible
    if lane.queue_policy[1] != "vtc" or rule == "never" or isinstance(rule, AfterFraction):
        return ""
    return "priority" if rule == "priority" else "always"


def share_grace_end(lane: LaneRuntime, entry: Entry) -> float | None:
    """When queued ``entry`` may have a slot given back to its tenant (its lane's
    ``preempt_after_ms`` after it queued, or at once); ``None`` in a lane without shares."""
    if lane.shares is None or not share_rule(lane.spec):
        return None
    after_ms = lane.spec.preempt_after_ms
    return entry.enqueued_at + (after_ms / 1000.0 if after_ms is not None else 0.0)


def stop_for_store(model: ModelRuntime, entry: Entry) -> Preempt:
    """Distributed mode: the store chose running ``entry`` as a victim for a waiter that
    may be on another replica. It is stopped by its lane's action, as ``_preempt`` does;
    no lane of this replica is owed the slot (the store grants it)."""
    return _stop(model, entry)


def victim_order(entry: Entry, now: float) -> tuple[int, int, float]:
    """Sort key: lowest priority first, then least progress lost, then newest."""
    return (-entry.ticket.priority, generated_tokens(entry, now), -entry.admitted_at)


def choose_victim(candidates: Iterable[Entry], now: float) -> Entry | None:
    """The candidate whose preemption costs least, or ``None``."""
    return min(candidates, key=lambda entry: victim_order(entry, now), default=None)


def preempt_for_blocked(model: ModelRuntime, now: float, out: list[Decision]) -> None:
    """Preempt a running ticket for each lane whose waiting head is urgent or reclaiming.

    Appends the ``Preempt`` decisions to ``out`` and sets ``model.wakeup``: the
    next moment a blocked head becomes urgent, a victim becomes preemptible, or an
    open circuit lets a probe through.
    """
    wakeups: list[float] = []
    waiting = False
    for lane in model.lane_order:
        head = lane.queue.peek()
        if head is None:
            continue
        waiting = True
        if lane.pending_preempts or not model.running_entries:
            continue
        if lane.shares is not None and _share_preempt(model, lane, head, now, out, wakeups):
            continue
        if model.borrowed_running == 0 and not model.runs_less_important_than(head.ticket.priority):
            continue
        units = head.ticket.units
        lane_full = lane.own + units > lane.cap and not (lane.borrow and model.lendable() >= units)
        reclaim = not lane_full and model.borrowed_running > 0
        if not reclaim and not model.runs_less_important_than(head.ticket.priority):
            continue
        urgent_at = urgent_time(model, lane.spec, head)
        urgent = now >= urgent_at
        if not urgent:
            wakeups.append(urgent_at)
            if not reclaim:
                continue
        candidates = [
            victim
            for victim in _victims(model, lane, head, urgent=urgent, reclaim=reclaim)
            if _would_unblock(model, lane, head, victim, lane_full=lane_full, now=now)
        ]
        ready = [v for v in candidates if is_preemptible(v, model.lanes[v.ticket.lane].spec, now)]
        victim = choose_victim(ready, now)
        if victim is None:
            wakeups.extend(_eligible_at(model, candidates, now))
            continue
        _preempt(model, lane, victim, out)
    if waiting and not any_healthy(model.backends, now):
        wakeups.extend(t for b in model.backends if (t := b.circuit.reopen_at()) is not None)
    model.wakeup = min(wakeups) if wakeups else None


def _share_preempt(
    model: ModelRuntime,
    lane: LaneRuntime,
    head: Entry,
    now: float,
    out: list[Decision],
    wakeups: list[float],
) -> bool:
    """Give ``head``'s tenant its share of ``lane``'s slots back; ``True`` if a ticket was stopped.

    Applies when ``head`` is blocked by what a stop frees (a slot, or the token
    budget), its tenant is under its share and, if the lane sets
    ``preempt_after_ms``, it has waited that long. The candidates are running tickets
    of the lane's tenants that stay at or above their share after giving one slot
    back, of ``head``'s priority or less important (under ``preemptible: priority``,
    only the tiers preemptible at any time, 4–5), whose release makes ``head``
    fit the token budget, and not admitted at this very instant (then the search
    runs again ``RECHECK_S`` later). The victim is the newest preemptible ticket of
    the tenant furthest over its share; if every candidate is fraction-gated, their
    eligibility times join ``wakeups``.
    """
    shares = lane.shares
    preemptible = lane.spec.preemptible
    # A ticket preemptible only past a fraction of its output would lose that much work,
    # while waiting for it costs only the rest: such a lane gives slots back by finishing.
    if shares is None or preemptible == "never" or isinstance(preemptible, AfterFraction):
        return False
    fits = model.tokens_fit(head)
    if fits and model.lane_has_room(lane) and model.units_fit(lane, head, False):
        return False
    slots = min(lane.cap, model.cap())
    tenant = head.ticket.tenant
    if not shares.under_share(tenant, slots):
        return False
    after_ms = lane.spec.preempt_after_ms
    if after_ms is not None and now < head.enqueued_at + after_ms / 1000.0:
        # A grace: a running ticket usually finishes sooner, and no work is thrown away.
        wakeups.append(head.enqueued_at + after_ms / 1000.0)
        return False
    over: dict[str, float] = {}
    for other in shares.running:
        if other != tenant:
            ratio = shares.over_share(other, tenant, slots)
            if ratio > 0.0:
                over[other] = ratio
    if not over:
        return False
    name = lane.spec.name
    budget = model.token_budget or 0
    # Under priority tiers only the tiers preemptible at any time give slots back: a
    # priority 2–3 ticket past 80% would lose most of its work and ends soon anyway.
    lowest = ALWAYS_FROM if preemptible == "priority" else head.ticket.priority
    candidates: list[Entry] = []
    fresh = False
    for victim in model.running_entries.values():
        if (
            victim.state is State.RUNNING
            and victim.ticket.lane == name
            and victim.ticket.tenant in over
            and victim.ticket.priority >= max(lowest, head.ticket.priority)
            and (fits or model.inflight_tokens - victim.cost_tokens + head.cost_tokens <= budget)
        ):
            if victim.admitted_at < now:
                candidates.append(victim)
            else:
                fresh = True
    ready = [victim for victim in candidates if is_preemptible(victim, lane.spec, now)]
    if not ready:
        wakeups.extend(_eligible_at(model, candidates, now))
        if fresh:
            # Spared only for being admitted this instant: look again a moment later.
            wakeups.append(now + RECHECK_S)
        return False
    victim = max(ready, key=lambda v: (over[v.ticket.tenant], v.admitted_at, v.seq))
    _preempt(model, lane, victim, out)
    return True


def _victims(
    model: ModelRuntime, lane: LaneRuntime, head: Entry, *, urgent: bool, reclaim: bool
) -> Iterator[Entry]:
    """Running tickets ``head`` may displace: borrowers when reclaiming, less important
    tickets when urgent."""
    name = lane.spec.name
    priority = head.ticket.priority
    for victim in model.running_entries.values():
        if victim.state is not State.RUNNING:
            continue
        if (reclaim and victim.borrowed and victim.ticket.lane != name) or (
            urgent and victim.ticket.priority > priority
        ):
            yield victim


def _would_unblock(
    model: ModelRuntime,
    lane: LaneRuntime,
    head: Entry,
    victim: Entry,
    *,
    lane_full: bool,
    now: float,
) -> bool:
    """Whether stopping ``victim`` frees what ``head`` waits for.

    A victim admitted at this very instant is never chosen: admitting and
    preempting in one step would only churn.
    """
    if victim.admitted_at >= now:
        return False
    if lane_full:
        return victim.ticket.lane == lane.spec.name and not victim.borrowed
    if model.tokens_fit(head):
        return True
    budget = model.token_budget or 0
    return model.inflight_tokens - victim.cost_tokens + head.cost_tokens <= budget


def _eligible_at(model: ModelRuntime, candidates: list[Entry], now: float) -> list[float]:
    """When fraction-gated candidates will have generated enough to be preemptible."""
    times = []
    for victim in candidates:
        ticket = victim.ticket
        lane = model.lanes[ticket.lane].spec
        fraction = required_fraction(lane, ticket.priority, streaming=ticket.streaming)
        if fraction is None:
            continue
        at = (
            victim.admitted_at
            + victim.prefill_s
            + fraction * victim.ticket.max_tokens * victim.decode_s_per_token
        )
        times.append(max(at, now + 0.01))
    return times


def _preempt(model: ModelRuntime, lane: LaneRuntime, victim: Entry, out: list[Decision]) -> None:
    """Stop ``victim`` for ``lane``, which is owed the slot it frees."""
    out.append(_stop(model, victim))
    victim.preempted_for = lane.spec.name
    lane.pending_preempts += 1


def _stop(model: ModelRuntime, victim: Entry) -> Preempt:
    """Mark ``victim`` preempting: requeue when its lane allows it, else abort."""
    victim_lane = model.lanes[victim.ticket.lane].spec
    requeue = (
        victim_lane.preempt_action == "requeue"
        and not victim.ticket.streaming
        and victim.requeues < victim_lane.max_requeues
    )
    victim.state = State.PREEMPTING
    victim.preempt_requeue = requeue
    action = PreemptAction.REQUEUE if requeue else PreemptAction.ABORT
    return Preempt(victim.ticket, victim.backend, action)
