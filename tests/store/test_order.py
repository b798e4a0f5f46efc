"""``encode_order``: the string order of encoded keys is the keys' tuple order."""

from __future__ import annotations

import math

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from sluicegate.store.order import encode_order

floats = st.floats(allow_nan=False) | st.sampled_from([0.0, -0.0, math.inf, -math.inf, 5e-324])


def _sign(value: int) -> int:
    return (value > 0) - (value < 0)


def _compare_tuples(a: tuple[float, ...], b: tuple[float, ...]) -> int:
    return _sign((a > b) - (a < b))


def _compare_strings(a: str, b: str) -> int:
    return _sign((a > b) - (a < b))


@given(
    st.integers(1, 4).flatmap(lambda n: st.tuples(*[st.lists(floats, min_size=n, max_size=n)] * 2))
)
@example(([-0.0], [0.0]))
@example(([-math.inf], [-1.7976931348623157e308]))
@example(([math.inf], [1.7976931348623157e308]))
@example(([-5e-324], [0.0]))
@example(([1.0, -2.0], [1.0, -3.0]))
def test_string_order_is_tuple_order(pair: tuple[list[float], list[float]]) -> None:
    """Same-length keys: the encodings compare (<, ==, >) exactly as the tuples do."""
    a, b = tuple(pair[0]), tuple(pair[1])
    assert _compare_strings(encode_order(a), encode_order(b)) == _compare_tuples(a, b)


@given(st.lists(floats, min_size=1, max_size=3), st.lists(floats, min_size=1, max_size=3))
def test_a_prefix_sorts_first(head: list[float], tail: list[float]) -> None:
    """A key that is a proper prefix of another encodes to a smaller string, as tuples compare."""
    key = tuple(head)
    longer = key + tuple(tail)
    assert encode_order(key) < encode_order(longer)
    assert key < longer


@given(st.lists(floats, max_size=4))
def test_encoding_is_sixteen_hex_digits_per_float(key: list[float]) -> None:
    """Fixed width, lowercase hex only (so never the member separator ``|``)."""
    encoded = encode_order(tuple(key))
    assert len(encoded) == 16 * len(key)
    assert set(encoded) <= set("0123456789abcdef")


def test_known_encodings() -> None:
    """Zero (either sign) flips only the sign bit; -1.0 flips every bit of its pattern."""
    assert encode_order((0.0,)) == encode_order((-0.0,)) == "8000000000000000"
    assert encode_order((1.0,)) == "bff0000000000000"
    assert encode_order((-1.0,)) == "400fffffffffffff"


def test_nan_is_refused() -> None:
    """NaN has no order, so it cannot be encoded."""
    with pytest.raises(ValueError, match="NaN"):
        encode_order((1.0, math.nan))
