"""``serve --workers`` tests: a real supervisor, its workers and their private Redis."""

from __future__ import annotations

import pytest

__all__ = ["pytest_configure"]


def pytest_configure(config: pytest.Config) -> None:
    """Register the ``workers`` marker (the suite runs with ``--strict-markers``)."""
    config.addinivalue_line(
        "markers", "workers: serve --workers N, real processes on one port (tests/workers)"
    )
