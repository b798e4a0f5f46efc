"""How long a refused client should wait before it retries: one rule for both headers.

The core hands out precise waits in seconds; the gateway turns them into
``retry-after-ms`` (the precise wait, which the OpenAI SDKs read first) and
``Retry-After`` (whole seconds, which HTTP requires, rounded up and at least 1).
"""

from __future__ import annotations

import math

UNKNOWN_WAIT_S = 60.0
"""The wait given when no finite estimate exists (e.g. nothing has ever completed)."""

MIN_WAIT_S = 0.001


def retry_wait_s(seconds: float) -> float:
    """``seconds`` made fit to send: finite, and at least one millisecond."""
    if not math.isfinite(seconds):
        return UNKNOWN_WAIT_S
    return max(MIN_WAIT_S, seconds)


def retry_after_values(seconds: float) -> tuple[int, int]:
    """``(Retry-After, retry-after-ms)`` for a wait of ``seconds``.

    Both round up, so a client that honours either is never early: a bucket
    that refills in 0.4 s gives ``(1, 400)``.
    """
    wait = retry_wait_s(seconds)
    millis = max(1, math.ceil(wait * 1000.0 - 1e-6))
    return max(1, math.ceil(millis / 1000.0)), millis
