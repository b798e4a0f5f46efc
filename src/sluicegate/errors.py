"""The one root of every exception sluicegate defines.

Every exception class under ``src/sluicegate`` derives from ``SluicegateError``; one that
callers also catch by a built-in type keeps that type as a second base (``ConfigError``
is a ``ValueError``, ``UnknownModelError`` a ``KeyError``). ``tests/test_error_root.py``
checks every module.

This module imports nothing from sluicegate, nor any I/O, so every layer may import it:
the sans-I/O ``core/`` and ``engine/`` included (``tests/core/test_sans_io.py`` allows
exactly this module from outside them). It is not compiled with mypyc (nor is
``core/core_errors.py``): its classes are plain Python exceptions.

An error becomes an HTTP answer in one place, the gateway app's exception handlers
(``gateway/app.py``), through ``gateway/http_errors.py``.
"""

from __future__ import annotations


class SluicegateError(Exception):
    """The base of every exception sluicegate raises of its own."""
