"""Pure transforms of a workload: rate scaling, time windows, truncation, max_tokens caps.

Every function takes and returns a ``list[WorkloadRequest]`` sorted by
``arrival_s`` and never mutates its input (requests are frozen dataclasses).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace
from typing import Literal, TypeAlias

from sluicegate.outcomes import WorkloadRequest

__all__ = [
    "MaxTokensPolicy",
    "check_max_tokens_policy",
    "head",
    "resolve_max_tokens",
    "scale_rate",
    "shift",
    "window",
]

MaxTokensPolicy: TypeAlias = Literal["exact", "pow2"] | int
"""How a request's ``max_tokens`` (the client's cap) is derived from its output length.

* ``"exact"``: ``max_tokens = output_tokens`` (the client asked for exactly what it got).
* ``"pow2"``: ``output_tokens`` rounded up to a power of two (1, 2, 4, … 1024, 2048),
  a stand-in for clients that set round caps well above the typical answer.
* an ``int`` cap ``c ≥ 1``: ``max_tokens = c``, and ``output_tokens`` is truncated to
  ``min(output_tokens, c)``, since an engine stops generating at the cap.
"""


def check_max_tokens_policy(policy: MaxTokensPolicy) -> None:
    """Validate a :data:`MaxTokensPolicy`.

    Raises:
        ValueError: not ``"exact"``, ``"pow2"`` or an integer ``>= 1``.
    """
    valid = (
        (policy in ("exact", "pow2"))
        if isinstance(policy, str)
        else (isinstance(policy, int) and not isinstance(policy, bool) and policy >= 1)
    )
    if not valid:
        raise ValueError(
            f"max_tokens policy must be 'exact', 'pow2' or an int >= 1, got {policy!r}"
        )


def resolve_max_tokens(output_tokens: int, policy: MaxTokensPolicy) -> tuple[int, int]:
    """Apply a :data:`MaxTokensPolicy` to one output length.

    Args:
        output_tokens: the true output length, ``>= 1``.
        policy: the policy (validate it once with :func:`check_max_tokens_policy`).

    Returns:
        ``(output_tokens, max_tokens)`` with ``output_tokens <= max_tokens``; the output
        is only changed (truncated) by an integer cap below it.
    """
    if policy == "exact":
        return output_tokens, output_tokens
    if policy == "pow2":
        return output_tokens, 1 << max(output_tokens - 1, 0).bit_length()
    cap = int(policy)
    return min(output_tokens, cap), cap


def scale_rate(requests: Sequence[WorkloadRequest], factor: float) -> list[WorkloadRequest]:
    """Replay a workload at ``factor`` times its rate: ``arrival_s' = arrival_s / factor``.

    Token counts and everything else are unchanged, so the offered load scales by
    ``factor`` too.

    Raises:
        ValueError: ``factor`` is not a finite number ``> 0``.
    """
    if not (math.isfinite(factor) and factor > 0.0):
        raise ValueError(f"rate factor must be a finite number > 0, got {factor!r}")
    return _sorted([replace(r, arrival_s=r.arrival_s / factor) for r in requests])


def window(
    requests: Sequence[WorkloadRequest], start_s: float, duration_s: float
) -> list[WorkloadRequest]:
    """Keep the requests arriving in ``[start_s, start_s + duration_s)``, rebased to 0.

    The rebase subtracts ``start_s`` (not the first kept arrival), so the result spans
    ``[0, duration_s)`` and ``len(result) / duration_s`` is the window's arrival rate.

    Raises:
        ValueError: ``start_s`` not finite, or ``duration_s`` not a finite number ``> 0``.
    """
    if not math.isfinite(start_s):
        raise ValueError(f"window start must be finite, got {start_s!r}")
    if not (math.isfinite(duration_s) and duration_s > 0.0):
        raise ValueError(f"window duration must be a finite number > 0, got {duration_s!r}")
    end_s = start_s + duration_s
    return _sorted(
        [replace(r, arrival_s=r.arrival_s - start_s) for r in requests
         if start_s <= r.arrival_s < end_s]
    )  # fmt: skip


def head(requests: Sequence[WorkloadRequest], n: int) -> list[WorkloadRequest]:
    """The first ``n`` requests by arrival (all of them when there are fewer).

    Raises:
        ValueError: ``n < 0``.
    """
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    return _sorted(requests)[:n]


def shift(requests: Sequence[WorkloadRequest], offset_s: float) -> list[WorkloadRequest]:
    """Delay every arrival by ``offset_s`` seconds (e.g. a tenant that starts later).

    Raises:
        ValueError: ``offset_s`` is not finite, or it would make an arrival negative.
    """
    if not math.isfinite(offset_s):
        raise ValueError(f"offset must be finite, got {offset_s!r}")
    shifted = _sorted([replace(r, arrival_s=r.arrival_s + offset_s) for r in requests])
    if shifted and shifted[0].arrival_s < 0.0:
        raise ValueError(f"offset {offset_s} makes an arrival negative ({shifted[0].arrival_s})")
    return shifted


def _sorted(requests: Sequence[WorkloadRequest]) -> list[WorkloadRequest]:
    """Stable sort by arrival, so equal arrivals keep their input order."""
    return sorted(requests, key=_arrival)


def _arrival(request: WorkloadRequest) -> float:
    return request.arrival_s
