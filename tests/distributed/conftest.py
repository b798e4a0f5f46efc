"""Distributed-mode tests: real gateway processes sharing one private Redis."""

from __future__ import annotations

import pytest

__all__ = ["pytest_configure"]


def pytest_configure(config: pytest.Config) -> None:
    """Register the ``distributed`` marker (the suite runs with ``--strict-markers``)."""
    config.addinivalue_line(
        "markers", "distributed: several gateway processes sharing one Redis (tests/distributed)"
    )
