"""Tests for tenant mixes: apply_mix and parse_mix (DESIGN §12)."""

from __future__ import annotations

from collections import Counter

import pytest

from sluicegate.outcomes import WorkloadRequest
from sluicegate.sim.workloads import MixEntry, MixError, apply_mix, parse_mix

CHAT = MixEntry(0.7, "chat", "interactive", 1)
BATCH = MixEntry(0.3, "batchco", "batch", 4, deadline_ms=60_000.0)


def _requests(n: int) -> list[WorkloadRequest]:
    return [WorkloadRequest(i * 0.01, 10 + i % 7, 5, 8, deadline_ms=99.0) for i in range(n)]


@pytest.mark.parametrize(
    "shares", [(0.7, 0.3), (0.5, 0.3, 0.2), (0.05, 0.95)], ids=["70-30", "50-30-20", "5-95"]
)
def test_apply_mix_shares_over_many_requests(shares: tuple[float, ...]) -> None:
    """Over 10,000 requests each entry's fraction is within 2 points of its share."""
    entries = [MixEntry(s, f"t{i}", "interactive", 2) for i, s in enumerate(shares)]
    counts = Counter(r.tenant for r in apply_mix(_requests(10_000), entries, seed=1))
    for i, share in enumerate(shares):
        assert counts[f"t{i}"] / 10_000 == pytest.approx(share, abs=0.02)


def test_apply_mix_sets_fields_and_keeps_the_rest() -> None:
    """Each request takes its entry's tenant, lane, priority and deadline; nothing else changes."""
    before = _requests(500)
    after = apply_mix(before, [CHAT, BATCH], seed=2)
    by_tenant = {e.tenant: e for e in (CHAT, BATCH)}
    for old, new in zip(before, after, strict=True):
        entry = by_tenant[new.tenant]
        assert (new.lane, new.priority, new.deadline_ms) == (
            entry.lane,
            entry.priority,
            entry.deadline_ms,
        )
        assert (new.arrival_s, new.prompt_tokens, new.output_tokens, new.max_tokens) == (
            old.arrival_s,
            old.prompt_tokens,
            old.output_tokens,
            old.max_tokens,
        )


def test_apply_mix_is_deterministic_for_a_seed() -> None:
    """The same seed assigns the same entries; another seed assigns differently."""
    requests = _requests(200)
    assert apply_mix(requests, [CHAT, BATCH], seed=3) == apply_mix(requests, [CHAT, BATCH], seed=3)
    assert apply_mix(requests, [CHAT, BATCH], seed=3) != apply_mix(requests, [CHAT, BATCH], seed=4)


def test_apply_mix_rejects_shares_not_summing_to_one() -> None:
    """Shares must sum to 1 within 1e-6."""
    with pytest.raises(MixError, match="sum to 1"):
        apply_mix(_requests(3), [CHAT, MixEntry(0.2, "b", "batch", 4)], seed=1)


def test_apply_mix_accepts_rounding_in_shares() -> None:
    """Shares that sum to 1 up to float rounding are accepted."""
    thirds = [MixEntry(0.3333333, f"t{i}", "interactive", 2) for i in range(3)]
    assert len(apply_mix(_requests(30), thirds, seed=1)) == 30


def test_parse_mix_reads_entries() -> None:
    """The CLI form share:tenant:lane:priority[:deadline_ms] parses, ignoring whitespace."""
    assert parse_mix(" 0.7:chat:interactive:1 , 0.3:batchco:batch:4:60000") == [CHAT, BATCH]


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("", "empty mix"),
        ("   ", "empty mix"),
        ("0.7:chat:interactive", "mix entry 1 ('0.7:chat:interactive'): expected share:tenant"),
        ("1.0:chat:interactive:1,", "mix entry 2 (''): expected"),
        ("0.5:a:l:1,0.5:b:l:1:2:3", "mix entry 2"),
        ("half:chat:interactive:1", "share 'half' is not a number"),
        ("0.5:a:l:1,0.5:b:l:high", "mix entry 2 ('0.5:b:l:high'): priority 'high' is not"),
        ("1.0:a:l:9", "priority must be an integer in [0, 5]"),
        ("1.0:a:l:1:-5", "deadline_ms must be a finite number > 0"),
        ("1.0:a:l:1:soon", "deadline_ms 'soon' is not a number"),
        ("1.0::l:1", "tenant and lane must be non-empty"),
        ("1.5:a:l:1", "share must be in (0, 1]"),
        ("0.7:a:l:1,0.2:b:l:1", "shares must sum to 1"),
    ],
)
def test_parse_mix_errors(text: str, fragment: str) -> None:
    """A malformed mix raises MixError (a ValueError) that says which entry and why."""
    with pytest.raises(MixError) as info:
        parse_mix(text)
    assert fragment in str(info.value)
    assert isinstance(info.value, ValueError)
