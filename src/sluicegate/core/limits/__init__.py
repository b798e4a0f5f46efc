"""Adaptive concurrency limits: the ``Limit`` seam, its registry and a factory.

Each mode is one small class in its own module, registered by name in
``LIMITS``; importing this package imports them all so the registry is full.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import cast

from sluicegate.core.limits import aimd, gradient, kv_cache
from sluicegate.core.limits.base import LIMITS, Limit, SampleKind
from sluicegate.core.spec import AdaptiveSpec

__all__ = ["LIMITS", "Limit", "SampleKind", "limit_names", "make_limit"]

# Importing the modules registers them; keep the names referenced for linters.
_IMPLEMENTATIONS = (aimd, gradient, kv_cache)


def limit_names() -> frozenset[str]:
    """The names of every registered adaptive-limit mode."""
    return LIMITS.names()


def make_limit(spec: AdaptiveSpec, cap: int) -> Limit:
    """Build the limit ``spec.mode`` names, starting at ``cap``.

    Args:
        spec: The model's adaptive-limit settings.
        cap: The configured concurrency ceiling; the limit moves in ``[spec.floor, cap]``.

    Returns:
        A fresh limit whose ``value`` is ``cap``.

    Raises:
        ValueError: If ``cap`` is below ``spec.floor``.
        KeyError: If no limit is registered under ``spec.mode``.
    """
    if cap < spec.floor:
        raise ValueError(
            f"adaptive limit cap must be >= floor ({spec.floor}), got {cap}; "
            "raise max_concurrency or lower adaptive.floor"
        )
    # The protocol cannot declare a constructor, so state the one every mode shares.
    factory = cast(Callable[[AdaptiveSpec, int], Limit], LIMITS.get(spec.mode))
    return factory(spec, cap)
