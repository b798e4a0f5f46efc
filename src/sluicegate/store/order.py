"""Lane ordering keys as strings whose byte order is the keys' numeric order.

The store keeps each lane's waiting tickets in a Redis sorted set with every
score 0, so members sort by their bytes; prefixing a member with
``encode_order(key)`` makes ``ZRANGE q 0 0`` the ticket with the smallest key.
"""

from __future__ import annotations

import math
import struct

__all__ = ["encode_order"]

_SIGN = 1 << 63
_ALL = (1 << 64) - 1


def _encode_float(value: float) -> str:
    if math.isnan(value):
        raise ValueError("an ordering key cannot contain NaN")
    # +0.0 turns -0.0 into 0.0: the two compare equal, so they must encode equal.
    (bits,) = struct.unpack(">Q", struct.pack(">d", value + 0.0))
    # Negative floats sort backwards by their bits: flip them all; positives: flip the sign.
    bits = bits ^ _ALL if bits & _SIGN else bits | _SIGN
    return f"{bits:016x}"


def encode_order(key: tuple[float, ...]) -> str:
    """Encode ``key`` as 16 lowercase hex digits per float, in order.

    For keys of the same length, string order equals tuple order (equal tuples
    give equal strings, ``-0.0`` and ``0.0`` included, infinities sort at the
    ends); a key that is a proper prefix of another also sorts first, as in
    tuple order. The result never contains ``|``.

    Raises:
        ValueError: if ``key`` contains NaN, which has no place in an order.
    """
    return "".join(_encode_float(value) for value in key)
