"""The one error the shared store raises."""

from __future__ import annotations

__all__ = ["StoreUnavailableError"]


class StoreUnavailableError(Exception):
    """The store could not be reached or did not answer within its timeout.

    Every Redis error, timeout and connection error surfaces as this one type, so
    the gateway has a single failure to switch to its ``on_store_failure`` mode on.
    The original error is the ``__cause__``.
    """
