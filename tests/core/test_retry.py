"""The one rule for retry headers (core/retry.py): precise milliseconds, whole seconds."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sluicegate.core.retry import UNKNOWN_WAIT_S, retry_after_values, retry_wait_s


@pytest.mark.parametrize(
    ("seconds", "expected"),
    [
        (0.4, (1, 400)),
        (0.0004, (1, 1)),
        (0.0, (1, 1)),
        (-3.0, (1, 1)),
        (1.0, (1, 1000)),
        (1.0001, (2, 1001)),
        (2.5, (3, 2500)),
        (math.inf, (60, 60_000)),
        (math.nan, (60, 60_000)),
    ],
)
def test_values(seconds: float, expected: tuple[int, int]) -> None:
    """retry-after-ms is the wait rounded up to a millisecond (at least 1); Retry-After is
    that wait in whole seconds rounded up (at least 1); no estimate means 60 s."""
    assert retry_after_values(seconds) == expected


@given(st.floats(min_value=0.0, max_value=1e6, allow_nan=False))
def test_headers_never_early_and_agree(seconds: float) -> None:
    """Neither header tells a client to come back before ``seconds`` have passed, the
    millisecond one is less than 1 ms late, and the two agree."""
    whole, millis = retry_after_values(seconds)
    assert millis / 1000.0 >= seconds - 1e-9
    assert millis / 1000.0 < max(seconds, 0.001) + 0.001
    assert whole == max(1, math.ceil(millis / 1000.0))


def test_wait_is_finite_and_positive() -> None:
    """What the scheduler hands out is a finite wait of at least a millisecond."""
    assert retry_wait_s(math.inf) == UNKNOWN_WAIT_S
    assert retry_wait_s(-1.0) == 0.001
    assert retry_wait_s(0.25) == 0.25
