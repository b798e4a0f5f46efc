"""Exceptions of the core: driver bugs, not expected outcomes (those are decisions).

Kept apart from the compiled hot-path modules: mypyc compiles classes that
derive from ``Exception`` only, and these derive from ``KeyError`` and from
``SluicegateError`` (``sluicegate/errors.py``, the one root, not compiled either).
"""

from __future__ import annotations

from sluicegate.errors import SluicegateError


class UnknownModelError(SluicegateError, KeyError):
    """The ticket names a model or lane that is not configured (a driver bug: check first)."""
