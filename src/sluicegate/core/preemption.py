"""Preemption rules (DESIGN §7): who may be preempted, when, and which victim first.

Tiers by priority when a lane says ``preemptible: priority``: 0–1 never;
2–3 only after 80% of ``max_tokens`` is generated (the partial answer is
useful); 4–5 at any time. A lane may instead fix one rule for all its tickets
(``never``, ``always``, or ``after_fraction``).
"""

from __future__ import annotations

from collections.abc import Iterable

from sluicegate.core.entry import Entry
from sluicegate.core.spec import AfterFraction, LaneSpec

STANDARD_FRACTION = 0.8
NEVER_BELOW = 2  # priorities 0 and 1
ALWAYS_FROM = 4  # priorities 4 and 5


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


def required_fraction(lane: LaneSpec, priority: int) -> float | None:
    """Fraction of ``max_tokens`` a ticket must have generated to be preemptible; None = never."""
    rule = lane.preemptible
    if rule == "never":
        return None
    if rule == "always":
        return 0.0
    if isinstance(rule, AfterFraction):
        return rule.after_fraction
    if priority < NEVER_BELOW:
        return None
    return 0.0 if priority >= ALWAYS_FROM else STANDARD_FRACTION


def is_preemptible(entry: Entry, lane: LaneSpec, now: float) -> bool:
    """Whether ``entry`` (running in ``lane``) may be preempted at ``now``."""
    fraction = required_fraction(lane, entry.ticket.priority)
    if fraction is None:
        return False
    if fraction <= 0.0:
        return True
    return generated_tokens(entry, now) >= fraction * entry.ticket.max_tokens


def victim_order(entry: Entry, now: float) -> tuple[int, int, float]:
    """Sort key: lowest priority first, then least progress lost, then newest."""
    return (-entry.ticket.priority, generated_tokens(entry, now), -entry.admitted_at)


def choose_victim(candidates: Iterable[Entry], now: float) -> Entry | None:
    """The candidate whose preemption costs least, or ``None``."""
    return min(candidates, key=lambda entry: victim_order(entry, now), default=None)
