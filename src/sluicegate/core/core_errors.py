"""Exceptions of the core: driver bugs, not expected outcomes (those are decisions).

Kept apart from the compiled hot-path modules: mypyc compiles classes that
derive from ``Exception`` only, and these derive from ``KeyError``.
"""

from __future__ import annotations


class UnknownModelError(KeyError):
    """The ticket names a model or lane that is not configured (a driver bug: check first)."""
