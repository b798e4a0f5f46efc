"""Tenant mixes: assign tenant, lane, priority and deadline to a trace's requests.

A trace records sizes and arrival times but not who sent each request. A mix is
a list of :class:`MixEntry` whose shares sum to 1; :func:`apply_mix` gives each
request, independently, entry ``i`` with probability ``share_i`` (a seeded
categorical draw). :func:`parse_mix` reads the CLI form
``"0.7:chat:interactive:1,0.3:batchco:batch:4"``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from sluicegate.errors import SluicegateError
from sluicegate.outcomes import WorkloadRequest

__all__ = ["SHARE_TOLERANCE", "MixEntry", "MixError", "apply_mix", "parse_mix"]

SHARE_TOLERANCE = 1e-6
"""How far the shares of a mix may sum from 1."""


class MixError(SluicegateError, ValueError):
    """A mix specification that is malformed or whose shares do not sum to 1."""


@dataclass(frozen=True, slots=True)
class MixEntry:
    """One class of requests in a mix.

    Attributes:
        share: the fraction of requests in this class, in ``(0, 1]``.
        tenant: tenant name (non-empty).
        lane: lane name (non-empty; that it exists is checked against the config later).
        priority: 0 (critical) … 5 (background).
        deadline_ms: per-request deadline, ``> 0``, or ``None`` for the lane's SLO.
    """

    share: float
    tenant: str
    lane: str
    priority: int
    deadline_ms: float | None = None

    def __post_init__(self) -> None:
        if not (math.isfinite(self.share) and 0.0 < self.share <= 1.0):
            raise MixError(f"share must be in (0, 1], got {self.share!r}")
        if not self.tenant or not self.lane:
            raise MixError(f"tenant and lane must be non-empty, got {self.tenant!r}, {self.lane!r}")
        if isinstance(self.priority, bool) or not 0 <= self.priority <= 5:
            raise MixError(f"priority must be an integer in [0, 5], got {self.priority!r}")
        if self.deadline_ms is not None and not (
            math.isfinite(self.deadline_ms) and self.deadline_ms > 0.0
        ):
            raise MixError(f"deadline_ms must be a finite number > 0, got {self.deadline_ms!r}")


def apply_mix(
    requests: Sequence[WorkloadRequest], entries: Sequence[MixEntry], *, seed: int
) -> list[WorkloadRequest]:
    """Give each request the tenant, lane, priority and deadline of a randomly drawn entry.

    Each request independently draws entry ``i`` with probability ``share_i``
    (``numpy`` ``Generator.choice`` seeded with ``seed``); the entry's four fields
    replace the request's, ``deadline_ms=None`` included. Arrivals and sizes are kept.

    Raises:
        MixError: no entries, or shares that do not sum to 1 within :data:`SHARE_TOLERANCE`.
    """
    _check_shares(entries)
    shares = np.array([e.share for e in entries], dtype=np.float64)
    picks = np.random.default_rng(seed).choice(
        len(entries), size=len(requests), p=shares / shares.sum()
    )
    out = [
        replace(r, tenant=e.tenant, lane=e.lane, priority=e.priority, deadline_ms=e.deadline_ms)
        for r, e in zip(requests, (entries[i] for i in picks.tolist()), strict=True)
    ]
    return sorted(out, key=lambda r: r.arrival_s)


def parse_mix(text: str) -> list[MixEntry]:
    """Parse ``share:tenant:lane:priority[:deadline_ms]`` entries separated by commas.

    Whitespace around entries and fields is ignored. Example:
    ``"0.7:chat:interactive:1,0.3:batchco:batch:4:60000"``.

    Raises:
        MixError: an empty spec or entry, a wrong number of fields, a value that does
            not parse or is out of range (the message names the entry), or shares that
            do not sum to 1.
    """
    if not text.strip():
        raise MixError("empty mix: expected share:tenant:lane:priority[:deadline_ms],...")
    entries = [_parse_entry(i, part.strip()) for i, part in enumerate(text.split(","), start=1)]
    _check_shares(entries)
    return entries


def _parse_entry(index: int, part: str) -> MixEntry:
    where = f"mix entry {index} ({part!r})"
    fields = [f.strip() for f in part.split(":")]
    if len(fields) not in (4, 5):
        raise MixError(
            f"{where}: expected share:tenant:lane:priority[:deadline_ms], got {len(fields)} "
            f"field{'s' if len(fields) != 1 else ''}"
        )
    share = _parse_float(where, "share", fields[0])
    try:
        priority = int(fields[3])
    except ValueError:
        raise MixError(f"{where}: priority {fields[3]!r} is not an integer") from None
    deadline = _parse_float(where, "deadline_ms", fields[4]) if len(fields) == 5 else None
    try:
        return MixEntry(share, fields[1], fields[2], priority, deadline)
    except MixError as exc:
        raise MixError(f"{where}: {exc}") from None


def _parse_float(where: str, name: str, text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise MixError(f"{where}: {name} {text!r} is not a number") from None


def _check_shares(entries: Sequence[MixEntry]) -> None:
    if not entries:
        raise MixError("a mix needs at least one entry")
    total = math.fsum(e.share for e in entries)
    if abs(total - 1.0) > SHARE_TOLERANCE:
        raise MixError(f"mix shares must sum to 1 (within {SHARE_TOLERANCE}), got {total:.6g}")
