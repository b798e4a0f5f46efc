"""Fixtures for tests against a real inference engine: llama-cpp-python serving a tiny GGUF
that the tests write themselves, with sluicegate in front of it.

The engine is started once per session (``llama_engine``); each test starts
its own gateway in a thread (``gateway_for``). Test modules skip, saying why,
when llama-cpp-python is not installed.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import pytest

from tests.gateway.gateway_harness import Stack
from tests.realengine.llama_server import LlamaServer, llama_server, require_llama_cpp
from tests.realengine.realengine_client import wait_engine_idle
from tests.realengine.realengine_stack import GatewayFactory, gateway_on

IDLE_WAIT_S = 30.0


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny GGUF, written once per session."""
    require_llama_cpp()
    from tests.realengine.tiny_gguf import write_tiny_gguf

    return write_tiny_gguf(tmp_path_factory.mktemp("realengine") / "tiny.gguf")


@pytest.fixture(scope="session")
def llama_engine(tiny_model: Path) -> Iterator[LlamaServer]:
    """The real engine, once per session, with ``--interrupt_requests false``."""
    require_llama_cpp()
    with llama_server(tiny_model, tiny_model.with_suffix(".log")) as server:
        yield server


@pytest.fixture
def gateway_for(llama_engine: LlamaServer) -> GatewayFactory:
    """Start a gateway in front of the session's engine: ``with gateway_for(body) as gw``."""

    def start(body: str = "", **options: Any) -> AbstractContextManager[Stack]:
        return gateway_on(llama_engine.port, body, **options)

    return start


@pytest.fixture(autouse=True)
def _engine_left_idle(request: pytest.FixtureRequest) -> Iterator[None]:
    """After a test that used the engine, wait (bounded) until the engine is idle, so a
    request a test left running never delays the next test's timings."""
    yield
    if "llama_engine" in request.fixturenames:
        engine: LlamaServer = request.getfixturevalue("llama_engine")
        wait_engine_idle(engine.url, IDLE_WAIT_S)
