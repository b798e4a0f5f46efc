"""Adaptive concurrency limits (DESIGN §5): ``LIMITS`` lists every mode by name.

Each mode is one small ``Limit`` subclass in its own module, holding only its
rule; the bounds, the clamp and the outcome listener live in ``limit.py``.
"""

from __future__ import annotations

from sluicegate.core.component_specs import AdaptiveSpec
from sluicegate.core.limits.aimd import AimdLimit
from sluicegate.core.limits.gradient import GradientLimit
from sluicegate.core.limits.kv_cache import KvCacheLimit
from sluicegate.core.limits.limit import Limit, SampleKind
from sluicegate.core.limits.slo import SloLimit
from sluicegate.core.registry import Registry

__all__ = ["LIMITS", "Limit", "SampleKind", "limit_names", "make_limit"]

LIMITS: Registry[type[Limit]] = Registry(
    "adaptive limit mode",
    ((limit.name, limit) for limit in (KvCacheLimit, GradientLimit, AimdLimit, SloLimit)),
)


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
    return LIMITS.get(spec.mode)(spec, cap)
