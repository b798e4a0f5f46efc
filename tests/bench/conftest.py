"""Fixtures of the load generator's tests: a loopback stub server (see ``stub_server``)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from tests.bench.stub_server import Stub, start_stub


@pytest.fixture
async def stub() -> AsyncIterator[Stub]:
    """A stub server on an ephemeral loopback port, shut down after the test."""
    server, runner = await start_stub()
    try:
        yield server
    finally:
        await runner.cleanup()
